"""The gates of the engine's replayed SpecFold forward (``graphs.BatchGraphs``): packed batches of fixed
sizes and no host read.

Gate ``g`` computes its fold flags (``fold_test``, SPEC section 2's test in float32) or takes its
forced mask, folds the padding rows into row 0, resolves every position's origin and packs the computed
positions first, and hands the folded layers the first ``capacity[g]`` of them with every position's
slot among them; ``overflow`` is set when a gate computes more than its capacity.

The padding's folds, the resolution and packing, the slots' clamp to the capacity and the overflow flag
run as one Triton launch (``ops.resolve_folds_packed``, the backend's resolve kernel: pointer jumping and
a prefix sum over the ``[R, B]`` tile) wherever Triton runs (CUDA, or the interpreter), or as tensor ops
(``FoldChains.resolve``: pointer jumping by gathers, a stable sort, a cumulative sum). Both give the same
outputs for the same mask; the kernel is one node of a captured graph where the tensor ops are about
twenty, each a launch of its own. ``resolve_kernel=False`` takes the
tensor ops (``BatchGraphs(gate_kernel=False)``: to bisect a wrong result between the two).

The kernel resolves a batch in one program, so its time grows with the batch: it takes batches of up to
``KERNEL_TILE_MAX`` positions (256 rows of 32), the tensor ops larger ones (many requests at once). On an
H100 at the 1.5B shape, the kernel served 1 and 4 requests at once 1.2x faster and 16 (forwards of at most
256 rows) 1.01-1.04x; taking forwards of up to 512 rows too, it served 64 requests 7-10% slower
(docs/serving.md, "CUDA graphs").
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ..reference import FoldChains, fold_test, safe_parents

__all__ = ["CapacityGates", "check_gate_kernel", "KERNEL_TILE_MAX"]

KERNEL_TILE_MAX = 8192  # at most kernels.gate.REGISTER_TILE_MAX (the largest tile resolved in registers)


def check_gate_kernel(value, device: torch.device) -> bool:
    """``gate_kernel``: None (the Triton resolve kernel wherever Triton runs on ``device``), True (it,
    refused where it cannot run) or False (tensor ops); returns whether the kernel resolves."""
    runs = ops.triton_runs(device)
    if value is None:
        return runs
    if not isinstance(value, bool):
        raise ValueError(f"gate_kernel: expected None, True or False, got {value!r}")
    if value and not runs:
        raise ValueError(f"gate_kernel: True needs Triton on {device} (a CUDA device, or TRITON_INTERPRET=1)")
    return value


class CapacityGates:
    """``reference.FoldGates`` over a replayed batch (module docstring). ``parents``: int64 ``[R]``, the
    rows' parents offset to the concatenation (a main row's -1, a padding row's 0); ``pad_rows``: bool
    ``[R]``; ``forced``: bool ``[G, R, B]`` or None; ``capacity``: the positions each gate packs;
    ``resolve_kernel``: the Triton kernel resolves, where the batch fits ``KERNEL_TILE_MAX``; ``test``: the
    fold test, ``reference.fold_test`` or the same compiled (``compiled.gate_test``)."""

    def __init__(self, parents: Tensor, block: int, depth: int, tau: Tensor, capacity: tuple[int, ...],
                 pad_rows: Tensor, forced: Tensor | None, resolve_kernel: bool = False, test=fold_test):
        self.test = test
        self.parents = parents
        self.resolve_kernel = resolve_kernel and parents.numel() * block <= KERNEL_TILE_MAX
        # The tensor ops resolve through the whole chains; the kernel resolves from the parents itself, so
        # there only a gated gate's fold test needs anything made here: each row's parent row.
        self.chains = None if self.resolve_kernel else FoldChains(parents, block, depth)
        self.parent = (self.chains.parent if self.chains is not None
                       else None if forced is not None else safe_parents(parents))
        self.tau, self.capacity, self.pad_rows, self.forced = tau, capacity, pad_rows, forced
        self.masks: list[Tensor] = []
        self.overflow = torch.zeros((), dtype=torch.bool, device=parents.device)

    def __call__(self, h: Tensor) -> tuple[Tensor, Tensor]:
        if self.forced is None:
            fold = self.test(h, self.parent, self.tau)
            if not self.resolve_kernel:  # (the kernel clears the rows of no valid parent itself)
                fold = fold & self.chains.valid[:, None]
        else:
            fold = self.forced[len(self.masks)]
        capacity = self.capacity[len(self.masks)]
        if self.resolve_kernel:  # the padding's folds, the clamp and the overflow flag in the same launch
            fold, rows, _, slot = ops.resolve_folds_packed(fold, self.parents, self.pad_rows, capacity, self.overflow)
        else:
            fold = (fold | self.pad_rows[:, None]) & self.chains.valid[:, None]
            _, rows, count, slot = self.chains.resolve(fold)
            self.overflow |= count > capacity
            slot = slot.clamp(max=capacity - 1)
        self.masks.append(fold)
        return rows[:capacity], slot
