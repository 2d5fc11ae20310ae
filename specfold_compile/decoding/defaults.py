"""The decoding defaults, in one place: ``generate``, ``record_traces`` and the command line read them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DecodingDefaults", "DEFAULTS", "CONFIDENCE_DTYPES"]

# "model": the softmax and the threshold comparison in the logits' own dtype, as both reference
# implementations compute them; "float32": the softmax of the logits cast to float32.
CONFIDENCE_DTYPES = ("model", "float32")


@dataclass(frozen=True)
class DecodingDefaults:
    """``max_new_tokens``: generated tokens per prompt. ``draft_budget``: Spiffy's drafts per call (at 8
    the shipped model accepted no draft on some tasks). ``threshold``: the commit rule's confidence
    threshold (both families' model cards: 0.9). ``confidence_dtype``: ``"model"``, so that a bf16 or fp16
    checkpoint commits where its reference ``generate`` does (``generate``'s docstring).
    ``fuse_boundaries``: a block's first state verified by the pass that writes the prefix before it
    (``generate``'s docstring); off: every step its own call, as the references decode."""

    max_new_tokens: int = 128
    draft_budget: int = 16
    threshold: float = 0.9
    confidence_dtype: str = "model"
    fuse_boundaries: bool | str = False


DEFAULTS = DecodingDefaults()
