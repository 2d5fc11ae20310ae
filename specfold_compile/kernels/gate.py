"""Triton fold gate: fold flags, origin resolution and compaction, without host synchronisation.

One launch (``_fold_gate_kernel``), its grid depends on shapes only:
  1. every program computes the fold flags of BLOCK_ROWS rows (n, b): fp32 sums of squares of the
     row-minus-parent difference and of the parent row, chunked over C;
  2. the last program to finish (an arrival counter; see ``_common.arrival_counter``) resolves the
     whole [N, B] fold tile (``_resolve_tile``): compaction positions with ``tl.cumsum``
     (deterministic); origins and slots as maxima over each row's ancestors (an ancestor matrix
     closed by ceil(log2(N - 1)) squarings in registers), so one memory round trip in all.
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
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, JUMPS: tl.constexpr, CHUNK_B: tl.constexpr,
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
    # compaction: scatter computed flat indices to their positions; zero the tail [count, N*B)
    tl.store(rows_ptr + pos, flat.to(tl.int64), mask=computed)
    tl.store(rows_ptr + flat, tl.zeros([BLOCK_N, BLOCK_B], dtype=tl.int64), mask=valid & (flat >= count))
    tl.store(count_ptr, count.to(tl.int64))
    # Publish every row's position (-1: folded) for the per-lane lookups below, which need it as
    # [m, lanes] tiles (registers cannot be indexed); slot_ptr is overwritten lane chunk by lane chunk.
    tl.store(slot_ptr + flat, tl.where(computed, pos, -1).to(tl.int64), mask=valid)

    # Origin without walking chains. Rows are in topological order, so walking up from row n meets
    # ancestors of decreasing index, and the first computed one is the computed ancestor-or-self of
    # largest index: origin(n, b) = max{m : anc[n, m] and computed(m, b)}. Its slot is the max of
    # pos(m, b) over the same m, since pos grows with m within a lane. anc (ancestor-or-self, [N, N])
    # is the closure of I + parent edges by JUMPS = ceil(log2(N - 1)) boolean squarings (tl.dot), all
    # in registers: one memory round trip in all instead of one per pointer-jumping round.
    rm = tl.arange(0, BLOCK_N)
    par = tl.load(parents_ptr + rn, mask=(rn >= 1) & (rn < N), other=-1)
    anc = ((rn[:, None] == rm[None, :]) | (par[:, None] == rm[None, :])).to(tl.float32)
    for _ in tl.static_range(JUMPS):
        anc = tl.minimum(tl.dot(anc, anc, input_precision="ieee"), 1.0)
    is_anc = anc > 0.5
    tl.debug_barrier()                                          # positions published
    for c0 in tl.static_range(0, BLOCK_B, CHUNK_B):
        rc = c0 + tl.arange(0, CHUNK_B)
        lanes = (rm[:, None] < N) & (rc[None, :] < B)
        pos_m = tl.load(slot_ptr + rm[:, None] * B + rc[None, :], mask=lanes, other=-1,
                        cache_modifier=".cg")                   # [m, lanes]
        cand = is_anc[:, :, None] & (pos_m[None, :, :] >= 0)    # [n, m, lanes]
        org = tl.max(tl.where(cand, rm[None, :, None], -1), axis=1)
        slot = tl.max(tl.where(cand, pos_m[None, :, :], -1), axis=1)
        tl.debug_barrier()                                      # every lane chunk read before it is rewritten
        out = (rn[:, None] < N) & (rc[None, :] < B)
        tl.store(origin_ptr + rn[:, None] * B + rc[None, :], (org * B + rc[None, :]).to(tl.int64), mask=out)
        tl.store(slot_ptr + rn[:, None] * B + rc[None, :], slot, mask=out)


@triton.jit
def _resolve_kernel(
    fold_ptr, parents_ptr, origin_ptr, rows_ptr, count_ptr, slot_ptr,
    N, B,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, JUMPS: tl.constexpr, CHUNK_B: tl.constexpr,
):
    _resolve_tile(fold_ptr, parents_ptr, origin_ptr, rows_ptr, count_ptr, slot_ptr, N, B,
                  BLOCK_N, BLOCK_B, JUMPS, CHUNK_B)


@triton.jit
def _fold_gate_kernel(
    h_ptr, parents_ptr, tau_ptr, fold_ptr, origin_ptr, rows_ptr, count_ptr, slot_ptr, arrivals_ptr,
    N, B, C,
    stride_hn, stride_hb,
    BLOCK_ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, JUMPS: tl.constexpr, CHUNK_B: tl.constexpr,
):
    _fold_flags_block(tl.program_id(0), h_ptr, parents_ptr, tau_ptr, fold_ptr, N * B, B, C,
                      stride_hn, stride_hb, BLOCK_ROWS, BLOCK_C)
    # Every thread's flag stores are issued before this program arrives (barrier), and the arrival is
    # a release/acquire atomic at GPU scope: the program that arrives last sees every program's flags.
    tl.debug_barrier()
    arrived = tl.atomic_add(arrivals_ptr, 1, sem="acq_rel")
    if arrived == tl.num_programs(0) - 1:
        _resolve_tile(fold_ptr, parents_ptr, origin_ptr, rows_ptr, count_ptr, slot_ptr, N, B,
                      BLOCK_N, BLOCK_B, JUMPS, CHUNK_B)
        tl.atomic_xchg(arrivals_ptr, 0)  # ready for the next launch (all programs have arrived)


def _tile_meta(N: int, B: int) -> dict:
    block_n = max(triton.next_power_of_2(max(N, 1)), 16)  # tl.dot needs >= 16
    block_b = max(triton.next_power_of_2(max(B, 1)), 2)
    # [n, m, lanes] candidate tiles of at most 8192 elements (about 64 registers a thread at 4 warps)
    chunk_b = max(1, min(block_b, 8192 // (block_n * block_n)))
    return dict(BLOCK_N=block_n, BLOCK_B=block_b, CHUNK_B=chunk_b,
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
