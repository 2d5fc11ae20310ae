"""``with collect_stats() as s: compiled(tokens, parents, cache)``: what the folded graph really did.

The gate op reports its outputs here when a collector is active. Recording keeps device tensors and
reads nothing back during the call; numbers are computed when a property is read. (Calls captured into
a CUDA graph, and its replays, are not recorded.) Collectors are per context (``contextvars``): a
``collect_stats()`` sees the calls of its own thread (or asyncio task) only.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import Tensor

from ..kernels.gate_ref import parents_invalid

_active: contextvars.ContextVar[tuple["FoldStats", ...]] = contextvars.ContextVar("specfold_collectors", default=())


@dataclass
class LayerStats:
    """Per gate (one per layer; two with gate="sublayer"), summed over the calls seen."""

    computed_draft_rows: int = 0
    draft_rows: int = 0
    folded_rows: int = 0
    chain_lengths: dict[int, int] = field(default_factory=dict)  # fold-chain length -> folded rows

    @property
    def recompute_ratio(self) -> float:
        return self.computed_draft_rows / self.draft_rows if self.draft_rows else float("nan")


class FoldStats:
    """What the folded graphs did while a ``collect_stats()`` was active (see the module docstring).

    ``calls`` counts folded calls, ``plain_calls`` those the backend ran on the plain graph;
    ``layers`` holds a ``LayerStats`` per gate; ``recompute_ratio``, ``folded_rows`` and
    ``chain_lengths`` sum them. ``repr()`` shows these numbers (it reads the recorded masks back).
    """

    def __init__(self) -> None:
        self._pending: list[tuple[int, Tensor, Tensor]] = []
        self._layers: list[LayerStats] = []
        self._last_masks: list[Tensor] = []
        self.calls = 0
        self._invalid_parent_calls = 0
        self.plain_calls = 0  # calls the backend ran on the plain graph (too few branches, or launched)
        self.launched_plain_calls = 0  # of those: calls that fold when captured, run plain as launched

    def _record(self, gate_index: int, fold: Tensor, parents: Tensor) -> None:
        if gate_index == 0:
            self.calls += 1
            self._last_masks = []
        self._pending.append((gate_index, fold.detach().clone(), parents.detach().clone()))
        self._last_masks.append(self._pending[-1][1])

    def _flush(self) -> None:
        for gate_index, fold, parents in self._pending:
            while len(self._layers) <= gate_index:
                self._layers.append(LayerStats())
            st = self._layers[gate_index]
            fold, parents = fold.cpu(), parents.cpu()
            if gate_index == 0 and bool(parents_invalid(parents)):
                self._invalid_parent_calls += 1
            n_rows, block = fold.shape
            st.draft_rows += (n_rows - 1) * block
            st.folded_rows += int(fold.sum())
            st.computed_draft_rows += (n_rows - 1) * block - int(fold.sum())
            for length, count in _chain_lengths(fold, parents).items():
                st.chain_lengths[length] = st.chain_lengths.get(length, 0) + count
        self._pending.clear()

    @property
    def layers(self) -> list[LayerStats]:
        self._flush()
        return self._layers

    @property
    def invalid_parent_calls(self) -> int:
        """Calls whose ``parents`` were invalid (eager ``model(...)`` raises on them): their rows with an
        invalid parent were computed, not folded (``fold_ops.invalid_parents_seen``)."""
        self._flush()
        return self._invalid_parent_calls

    @property
    def recompute_ratio(self) -> float:
        """Computed draft rows / all draft rows, over every layer (and call)."""
        layers = self.layers
        total = sum(s.draft_rows for s in layers)
        return sum(s.computed_draft_rows for s in layers) / total if total else float("nan")

    @property
    def folded_rows(self) -> int:
        return sum(s.folded_rows for s in self.layers)

    @property
    def chain_lengths(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for s in self.layers:
            for k, v in s.chain_lengths.items():
                out[k] = out.get(k, 0) + v
        return dict(sorted(out.items()))

    @property
    def fold_masks(self) -> list[Tensor]:
        """The per-gate bool [N, B] masks of the last call."""
        return list(self._last_masks)

    def __repr__(self) -> str:
        ratio = self.recompute_ratio
        return (f"FoldStats(calls={self.calls}, plain_calls={self.plain_calls}, "
                f"launched_plain_calls={self.launched_plain_calls}, gates={len(self.layers)}, "
                f"recompute_ratio={'nan' if ratio != ratio else f'{ratio:.3f}'}, folded_rows={self.folded_rows}, "
                f"chain_lengths={self.chain_lengths}, invalid_parent_calls={self.invalid_parent_calls})")


def _chain_lengths(fold: Tensor, parents: Tensor) -> dict[int, int]:
    """Length of each folded row's chain to its computed origin (1 = folded onto a computed parent)."""
    n_rows, _ = fold.shape
    depth = torch.zeros_like(fold, dtype=torch.int64)
    for n in range(1, n_rows):
        if fold[n].any():  # (a row with an invalid parent folds nothing)
            depth[n] = torch.where(fold[n], depth[int(parents[n])] + 1, torch.zeros_like(depth[n]))
    lengths = depth[fold]
    values, counts = torch.unique(lengths, return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts)}


def record_gate(gate_index: int, fold: Tensor, parents: Tensor) -> None:
    # A CUDA-graph capture runs no kernel, so the masks it would record hold no values (and later
    # replays run no Python): captured calls are not recorded.
    capturing = fold.is_cuda and torch.cuda.is_current_stream_capturing()
    active = _active.get()
    if active and not torch.compiler.is_compiling() and not capturing:
        for s in active:
            s._record(gate_index, fold, parents)


def record_plain_call() -> None:
    for s in _active.get():
        s.plain_calls += 1


def record_launched_plain_call() -> None:
    for s in _active.get():
        s.launched_plain_calls += 1


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Nothing is recorded inside (a call whose result is not returned, such as a warm-up)."""
    token = _active.set(())
    try:
        yield
    finally:
        _active.reset(token)


@contextlib.contextmanager
def collect_stats() -> Iterator[FoldStats]:
    """Record what the folded graphs do in this context (thread / asyncio task) while inside.

    ``with collect_stats() as s: compiled(tokens, parents, cache)``, then read ``s``: ``s.calls``
    (folded calls seen), ``s.plain_calls`` (calls run on the plain graph), ``s.recompute_ratio``
    (computed draft rows / draft rows over every gate), ``s.layers`` (per gate), ``s.chain_lengths``,
    ``s.fold_masks`` (the last call's masks) and ``s.invalid_parent_calls``; ``print(s)`` shows them.
    Recording reads nothing back during a call (the numbers are computed when read); calls captured
    into a CUDA graph are not recorded. Collectors nest: every active one records.
    """
    s = FoldStats()
    token = _active.set(_active.get() + (s,))
    try:
        yield s
    finally:
        _active.reset(token)
