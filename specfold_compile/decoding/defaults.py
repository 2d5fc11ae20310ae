"""The decoding defaults shared by ``specfold generate``, ``demo`` and ``eval`` (one place to change them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodingDefaults:
    """max_new_tokens: tokens to generate; draft_budget: Spiffy / SpecFold drafts verified per call;
    threshold: confidence at which a masked position commits; confidence_dtype: "model" compares the
    confidence in the model's dtype, as the reference implementations do."""

    max_new_tokens: int = 128
    draft_budget: int = 16
    threshold: float = 0.9
    confidence_dtype: str = "model"


DEFAULTS = DecodingDefaults()
