"""Triton fold gate: fold flags, origin resolution and compaction, without host synchronisation.

One launch (``_fold_gate_kernel``), its grid depends on shapes only:
  1. every program computes the fold flags of BLOCK_ROWS rows (n, b): fp32 sums of squares of the
     row-minus-parent difference and of the parent row, chunked over C;
  2. the last program to finish (an arrival counter; see ``_common.arrival_counter``) resolves the
     whole [N, B] fold tile (``_resolve_tile``): compaction positions with ``tl.cumsum``
     (deterministic), origins by pointer jumping (ceil(log2(N - 1)) rounds instead of a walk over N
     rows), slots by one gather.
Two launches cost more than the work at the real shapes (a few us each inside a CUDA graph), hence
one. ``resolve_folds`` runs step 2 alone on a given mask (``_resolve_kernel``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _common


@triton.jit
def _fold_flags_block(
    pid, h_ptr, parents_ptr, tau_ptr, fold_ptr,
    NB, B, C,
    stride_hn, stride_hb,
    BLOCK_ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
):
    flat = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    valid = flat < NB
    n = flat // B
    b = flat % B
    p = tl.load(parents_ptr + n, mask=valid & (n >= 1), other=0)
    p = tl.maximum(p, 0)
    row_off = n.to(tl.int64) * stride_hn + b.to(tl.int64) * stride_hb
    par_off = p.to(tl.int64) * stride_hn + b.to(tl.int64) * stride_hb
    ss_diff = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    ss_par = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        m = valid[:, None] & (cols[None, :] < C)
        x = tl.load(h_ptr + row_off[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
        y = tl.load(h_ptr + par_off[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
        d = x - y
        ss_diff += tl.sum(d * d, axis=1)
        ss_par += tl.sum(y * y, axis=1)
    tau = tl.load(tau_ptr).to(tl.float32)
    # sqrt-norm comparison keeps every edge case: NaN compares False, tau = 0 or a zero parent
    # gives "x < 0" which is False for any x >= 0.
    fold = (tl.sqrt(ss_diff) < tau * tl.sqrt(ss_par)) & (n >= 1)
    tl.store(fold_ptr + flat, fold.to(tl.int8), mask=valid)


@triton.jit
def _resolve_tile(
    fold_ptr, parents_ptr, origin_ptr, rows_ptr, count_ptr, slot_ptr,
    N, B,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, JUMPS: tl.constexpr,
):
    rn = tl.arange(0, BLOCK_N)
    rb = tl.arange(0, BLOCK_B)
    valid = (rn[:, None] < N) & (rb[None, :] < B)
    flat = rn[:, None] * B + rb[None, :]                       # int32 flat index n*B+b
    # .cg: the flags may have been written by other programs of this launch (read them from L2)
    fold = tl.load(fold_ptr + flat, mask=valid, other=0, cache_modifier=".cg") != 0
    fold = fold & (rn[:, None] >= 1)
    computed = valid & (fold == 0)
    ci = computed.to(tl.int32)
    # exclusive prefix over flat (row-major) order: rows before n, then lanes before b in row n
    in_row = tl.cumsum(ci, axis=1)                              # inclusive within row
    row_tot = tl.sum(ci, axis=1)
    row_excl = tl.cumsum(row_tot, axis=0) - row_tot
    pos = row_excl[:, None] + in_row - 1                        # valid where computed
    count = tl.sum(row_tot, axis=0)

    # Origin by pointer jumping: link = the same position of the parent row where folded, else itself
    # (computed rows are fixed points). After j rounds link is 2^j steps up the fold chain, so
    # JUMPS = ceil(log2(N - 1)) rounds reach the computed end of any chain. Registers cannot be
    # gathered, so each round goes through origin_ptr; the barriers make one round's stores visible to
    # every thread of this single program before the next round's loads (and keep loads before stores).
    par = tl.load(parents_ptr + rn, mask=(rn >= 1) & (rn < N), other=0).to(tl.int32)
    link = tl.where(fold, par[:, None] * B + rb[None, :], flat)
    for _ in tl.static_range(JUMPS):
        tl.store(origin_ptr + flat, link.to(tl.int64), mask=valid)
        tl.debug_barrier()
        link = tl.load(origin_ptr + link, mask=valid, other=0, cache_modifier=".cg").to(tl.int32)
        tl.debug_barrier()
    tl.store(origin_ptr + flat, link.to(tl.int64), mask=valid)
    # slot = compaction position of the origin (always a computed row): publish the computed rows'
    # positions, then gather them through the origin map.
    tl.store(slot_ptr + flat, pos.to(tl.int64), mask=computed)
    tl.debug_barrier()
    slot = tl.load(slot_ptr + link, mask=valid, other=0, cache_modifier=".cg")
    tl.debug_barrier()
    tl.store(slot_ptr + flat, slot, mask=valid)
    # compaction: scatter computed flat indices to their positions; zero the tail [count, N*B)
    tl.store(rows_ptr + pos, flat.to(tl.int64), mask=computed)
    tl.store(rows_ptr + flat, tl.zeros([BLOCK_N, BLOCK_B], dtype=tl.int64), mask=valid & (flat >= count))
    tl.store(count_ptr, count.to(tl.int64))


@triton.jit
def _resolve_kernel(
    fold_ptr, parents_ptr, origin_ptr, rows_ptr, count_ptr, slot_ptr,
    N, B,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, JUMPS: tl.constexpr,
):
    _resolve_tile(fold_ptr, parents_ptr, origin_ptr, rows_ptr, count_ptr, slot_ptr, N, B,
                  BLOCK_N, BLOCK_B, JUMPS)


@triton.jit
def _fold_gate_kernel(
    h_ptr, parents_ptr, tau_ptr, fold_ptr, origin_ptr, rows_ptr, count_ptr, slot_ptr, arrivals_ptr,
    N, B, C,
    stride_hn, stride_hb,
    BLOCK_ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, JUMPS: tl.constexpr,
):
    _fold_flags_block(tl.program_id(0), h_ptr, parents_ptr, tau_ptr, fold_ptr, N * B, B, C,
                      stride_hn, stride_hb, BLOCK_ROWS, BLOCK_C)
    # Every thread's flag stores are issued before this program arrives (barrier), and the arrival is
    # a release/acquire atomic at GPU scope: the program that arrives last sees every program's flags.
    tl.debug_barrier()
    arrived = tl.atomic_add(arrivals_ptr, 1, sem="acq_rel")
    if arrived == tl.num_programs(0) - 1:
        _resolve_tile(fold_ptr, parents_ptr, origin_ptr, rows_ptr, count_ptr, slot_ptr, N, B,
                      BLOCK_N, BLOCK_B, JUMPS)
        tl.atomic_xchg(arrivals_ptr, 0)  # ready for the next launch (all programs have arrived)


def _tile_meta(N: int, B: int) -> dict:
    return dict(BLOCK_N=max(triton.next_power_of_2(max(N, 1)), 2),
                BLOCK_B=max(triton.next_power_of_2(max(B, 1)), 2),
                JUMPS=max(N - 2, 0).bit_length())  # ceil(log2(N - 1)): the longest chain has N - 1 links


def _gate_outputs(N: int, B: int, dev):
    return (_common.empty((N, B), torch.int64, dev), _common.empty((N * B), torch.int64, dev),
            _common.empty((()), torch.int64, dev), _common.empty((N, B), torch.int64, dev))


def resolve_folds(fold: torch.Tensor, parents: torch.Tensor):
    """Origin map + compaction of a given fold mask [N, B] (bool); row 0 is never folded.

    Returns (origin [N,B] int64, rows [N*B] int64, count 0-d int64, slot [N,B] int64).
    """
    N, B = fold.shape
    fold_i8 = fold.contiguous().view(torch.int8) if fold.dtype == torch.bool else fold.to(torch.int8).contiguous()
    origin, rows, count, slot = _gate_outputs(N, B, fold.device)
    _resolve_kernel[(1,)](fold_i8, parents.contiguous(), origin, rows, count, slot, N, B,
                          **_tile_meta(N, B), num_warps=4)
    return origin, rows, count, slot


def fold_gate(h: torch.Tensor, parents: torch.Tensor, tau: torch.Tensor):
    """Fold gate for h [N, B, C] (fp32/fp16/bf16), parents int64 [N], tau float32 0-d tensor.

    Returns (fold_mask bool [N,B], origin int64 [N,B], rows int64 [N*B], count int64 0-d,
    slot int64 [N,B]). No host synchronisation.
    """
    assert h.dim() == 3, "h must be [N, B, C]"
    parents = parents.to(device=h.device, dtype=torch.int64).contiguous()
    tau = tau.to(device=h.device, dtype=torch.float32)
    N, B, C = h.shape
    if h.stride(-1) != 1:
        h = h.contiguous()
    fold = _common.empty((N, B), torch.int8, h.device)
    origin, rows, count, slot = _gate_outputs(N, B, h.device)
    if N * B == 0:
        count.zero_()
        return fold.view(torch.bool), origin, rows, count, slot
    BLOCK_C = min(triton.next_power_of_2(max(C, 1)), 1024)
    BLOCK_ROWS = 4 if BLOCK_C >= 512 else 16
    grid = (triton.cdiv(N * B, BLOCK_ROWS),)
    _fold_gate_kernel[grid](
        h, parents, tau, fold, origin, rows, count, slot, _common.arrival_counter(h.device),
        N, B, C, h.stride(0), h.stride(1),
        BLOCK_ROWS=BLOCK_ROWS, BLOCK_C=BLOCK_C, **_tile_meta(N, B), num_warps=4,
    )
    return fold.view(torch.bool), origin, rows, count, slot
