"""What decoding calls on a model: the interface ``decoding.generate`` and ``decoding.VerifyGraphs`` rely
on, declared as ``typing.Protocol`` classes (structural: any object with these members fits, the
package's ``BlockDiffusionLM`` and the decoding tests' fake model alike).

``DecodingModel`` is what ``generate`` calls: the prompt's prefill, the verification call and block
writes. ``StaticCacheModel`` adds what the CUDA-graph runner (``VerifyGraphs``) calls to keep a static
prefix cache and replay block writes. ``VerifyForward`` is the verification call alone: what a compiled
forward (``torch.compile(model, backend="specfold")``) provides, passed to the decoder next to the model
whose other members it uses (``generate(mode="specfold")``, ``VerifyGraphs(model, forward=...)``).

A ``torch.compile``'d module is an ``OptimizedModule``: calling it runs the compiled forward, and it
reads every other attribute from the module it wraps, so it fits these protocols as it is (the methods
it reaches are the module's own, eager); nothing in decoding needs to unwrap it.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

from torch import Tensor

from .config import DecodingRules

__all__ = ["DecodingConfig", "DecodingCache", "VerifyForward", "DecodingModel", "StaticCacheModel"]


class DecodingConfig(Protocol):
    """The config fields decoding reads (``models.ModelConfig`` has them all)."""

    block_size: int
    sub_block_size: int | None
    mask_token_id: int
    eos_token_id: int
    max_position_embeddings: int
    decoding_rules: DecodingRules
    shift_logits: bool  # read by generate(fuse_boundaries=True) only


class DecodingCache(Protocol):
    """What the decoder reads from a prefix cache: the logits that predict the next block's seed ([V],
    None for the empty cache). The CUDA-graph runner needs the package's own ``models.PrefixCache``."""

    next_logits: Tensor | None


@runtime_checkable
class VerifyForward(Protocol):
    """One multi-branch verification call: tokens int64 [N, B], parents int64 [N] and the prefix cache ->
    logits [N, B, V], or [M, V] for ``logit_positions`` (int64 [M] flat positions ``n * B + p``)."""

    def __call__(self, tokens: Tensor, parents: Tensor, cache: Any,
                 logit_positions: Tensor | None = None) -> Tensor: ...


@runtime_checkable
class DecodingModel(Protocol):
    """What ``generate`` and ``record_traces`` call. ``prefill`` gets ``block_causal=True`` only for a
    family whose blocks sit on the absolute grid (``decoding_rules.prompt_on_block_grid``), and
    ``compiled=True`` (``prefill`` and ``write_block``) only under ``generate(compile_writes=True)``."""

    config: DecodingConfig

    def __call__(self, tokens: Tensor, parents: Tensor, cache: Any,
                 logit_positions: Tensor | None = None) -> Tensor: ...

    def prefill(self, prompt_ids: Tensor, **kwargs: bool) -> DecodingCache: ...

    def write_block(self, cache: Any, block_tokens: Tensor, **kwargs: bool) -> DecodingCache: ...


@runtime_checkable
class StaticCacheModel(DecodingModel, Protocol):
    """What ``VerifyGraphs`` calls besides ``DecodingModel``'s members (``BlockDiffusionLM`` documents
    each): a static copy of a prefill's cache, a block write's checks (and a fused next block's), its
    tensor work on a static cache, an empty cache, a prompt's checks and its prefill into a static cache,
    and that tensor work compiled with the default backend."""

    def write_block(self, cache: Any, block_tokens: Tensor, causal: bool | None = None,
                    compiled: bool = False, next_block: Tensor | None = None) -> Any: ...

    def static_cache(self, cache: Any, capacity: int | None = None, out: Any = None) -> Any: ...

    def check_block(self, cache: Any, block_tokens: Tensor, causal: bool | None = None,
                    compiled: bool = False) -> tuple[int, int, bool]: ...

    def append_block_static(self, keys: list[Tensor], values: list[Tensor], device_length: Tensor,
                            block_tokens: Tensor, causal: bool, next_block: Tensor | None = None
                            ) -> tuple[Tensor, Tensor | None]: ...

    def check_next_block(self, next_block: Tensor | None, end: int, capacity: int | None = None) -> None: ...

    def empty_cache(self, device: Any = None) -> Any: ...

    def check_prompt(self, prompt_ids: Tensor, compiled: bool = False, block_causal: bool = False) -> None: ...

    def prefill_static(self, keys: list[Tensor], values: list[Tensor], device_length: Tensor, ids: Tensor,
                       prompt_length: Tensor, block_causal: bool, next_rows: int = 0) -> tuple[Tensor, Tensor | None]: ...

    def compiled_method(self, name: str) -> Callable[..., Any]: ...
