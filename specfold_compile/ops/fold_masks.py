"""Fold masks from outside the gate: recorded from a decode, or forced on one (trace-driven benchmarks).

P4 (docs/SPEC.md) makes a folded call's output a function of its inputs and its fold masks. A
benchmark that replays a recorded decode at a larger shape, with random weights, therefore forces the
recorded masks instead of the ones its own residuals would give: every call then does the work the
recorded decode's call did.

* ``recorded_fold_masks()``: every gate run inside appends ``(gate_index, fold_mask)`` (a copy, on the
  gate's device) to the yielded list. Launched calls only: a CUDA-graph replay runs no Python.
* ``forced_fold_masks(masks)``: ``masks`` [G, R, B] bool, a buffer on the model's device. Gate ``g`` of
  a call of N <= R rows folds exactly ``masks[g, :N]`` (row 0 and rows with an invalid parent never
  fold). The gate reads the buffer when it runs, so a CUDA graph captured inside keeps reading it:
  refill it in place between replays.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import Tensor

__all__ = ["recorded_fold_masks", "forced_fold_masks", "forced_flags", "record"]

_RECORDED: list[list] = []
_FORCED: list[Tensor] = []


@contextlib.contextmanager
def recorded_fold_masks() -> Iterator[list]:
    masks: list = []
    _RECORDED.append(masks)
    try:
        yield masks
    finally:
        _RECORDED.remove(masks)


@contextlib.contextmanager
def forced_fold_masks(masks: Tensor) -> Iterator[Tensor]:
    if not isinstance(masks, Tensor) or masks.dtype != torch.bool or masks.dim() != 3:
        raise ValueError(f"masks: expected a bool tensor [gates, rows, block], got {masks!r:.80}")
    _FORCED.append(masks)
    try:
        yield masks
    finally:
        _FORCED.remove(masks)


def forced_flags(gate_index: int, rows: int, block: int) -> Tensor | None:
    """The forced fold flags of gate ``gate_index`` for a call of ``rows`` x ``block``, or None."""
    if not _FORCED:
        return None
    masks = _FORCED[-1]
    if gate_index >= masks.shape[0] or rows > masks.shape[1] or block != masks.shape[2]:
        raise ValueError(f"forced fold masks {tuple(masks.shape)} do not cover gate {gate_index} of a "
                         f"[{rows}, {block}] call")
    return masks[gate_index, :rows]


def record(gate_index: int, fold_mask: Tensor) -> None:
    for masks in _RECORDED:
        masks.append((gate_index, fold_mask.clone()))
