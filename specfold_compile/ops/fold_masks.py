"""Fold masks from outside the gate: recorded from a decode, or forced on one (trace-driven benchmarks).

P4 (docs/SPEC.md) makes a folded call's output a function of its inputs and its fold masks. A
benchmark that replays a recorded decode at a larger shape, with random weights, therefore forces the
recorded masks instead of the ones its own residuals would give: every call then does the work the
recorded decode's call did.

* ``recorded_fold_masks()``: every gate run inside appends ``(gate_index, fold_mask)`` (a copy, on the
  gate's device) to the yielded list. Launched calls only: a CUDA-graph replay runs no Python.
* ``dense_fractions(recorded)``: from recorded masks, a head fraction a layer for the packed linears
  (``Tuning.dense_fraction`` as a sequence): each gate's computed share of the rows at a quantile.
* ``forced_fold_masks(masks)``: ``masks`` [G, R, B] bool, a buffer on the model's device. Gate ``g`` of
  a call of N <= R rows folds exactly ``masks[g, :N]`` (row 0 and rows with an invalid parent never
  fold). The gate reads the buffer when it runs, so a CUDA graph captured inside keeps reading it:
  refill it in place between replays.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
from torch import Tensor

__all__ = ["recorded_fold_masks", "dense_fractions", "forced_fold_masks", "forced_flags", "record"]

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


def dense_fractions(recorded, quantile: float = 0.9, gates_per_layer: int = 1) -> tuple[float, ...]:
    """Per decoder layer, the share of a call's rows its gate computed (``~fold_mask``: main rows,
    differing positions and their ripple), at ``quantile`` over the recorded calls: a ``dense_fraction``
    profile whose cuBLAS heads hold that share of the calls' computed rows, layer by layer (the rest
    spill to the count-aware GEMM).

    ``recorded``: ``(gate_index, fold_mask [N, B] bool)`` pairs, as ``recorded_fold_masks()`` yields
    them. ``gates_per_layer``: 2 for ``gate="sublayer"`` (a layer's head then holds the larger of its two
    gates' shares). Record on prompts like the workload's, apart from the ones measured.
    """
    if not (isinstance(quantile, (int, float)) and not isinstance(quantile, bool) and 0.0 < quantile <= 1.0):
        raise ValueError(f"quantile: expected a number in (0, 1], got {quantile!r}")
    if not (isinstance(gates_per_layer, int) and not isinstance(gates_per_layer, bool) and gates_per_layer >= 1):
        raise ValueError(f"gates_per_layer: expected an int >= 1, got {gates_per_layer!r}")
    shares: dict[int, list[float]] = {}
    for gate_index, mask in recorded:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() != 2 or mask.numel() == 0:
            raise ValueError(f"recorded: expected (gate_index, bool fold mask [N, B]) pairs, got a mask {mask!r:.60}")
        shares.setdefault(int(gate_index), []).append(float((~mask).sum()) / mask.numel())
    if not shares:
        raise ValueError("recorded: no fold masks (record a decode whose calls fold, inside recorded_fold_masks())")
    gates = max(shares) + 1
    missing = sorted(set(range(gates)) - set(shares))
    if missing or gates % gates_per_layer:
        raise ValueError(f"recorded: expected masks of gates 0..G-1 with G a multiple of gates_per_layer="
                         f"{gates_per_layer}; gates {sorted(shares)} recorded")
    at_quantile = []
    for g in range(gates):
        values = sorted(shares[g])
        at_quantile.append(values[max(math.ceil(quantile * len(values)) - 1, 0)])
    return tuple(max(at_quantile[i:i + gates_per_layer]) for i in range(0, gates, gates_per_layer))


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
