"""Triton folded ragged attention: the serving engine's SpecFold attention over several requests, read
from the packed rows.

A folded forward computes q, k, v for its computed positions only (``q_p [P, Hq, D]``, ``k_p, v_p
[P, Hkv, D]``; packed row ``p`` is flat position ``rows[p] = n * B + b`` of the concatenated ``[R, B]``
rows of every request), and every position ``(n, b)`` takes its origin's, packed row ``slot[n, b]``.
Dense ragged attention (``ragged_attention.py``) would expand them to every position and walk each
request's prefix once per position. Here:

1. the prefix is walked once per packed row: a folded position's query is its origin's, and its prefix
   (its request's first ``lengths[i]`` keys of pool slot ``slots[i]``) is too, so its prefix state (o, lse)
   is its origin's, the same numbers. One program takes a tile of (packed row, query head) pairs of one
   kv head, finds each row's request from ``bounds`` (row ``n`` of ``rows[p] // B``) and walks the prefix
   of every request its tile holds (consecutive packed rows mostly share one; each walk writes its own
   request's rows), writing one state a split of the capacity (flash-decoding, as
   ``attention.prefix_attention_states``; split count from the shapes and capacity, never the lengths);
2. ``attention.py``'s block kernel gives every position its attention over its own branch's block keys
   (``k_p, v_p`` through ``slot[n, :]``) merged with the prefix states of its origin, ``slot[n, b]``.

Two launches whatever the batch; nothing is read back to the host. Packed rows past the computed count
(a replayed graph's fixed capacity; the gates zero them) walk nothing. ``folded_ragged_attention_ref`` is the
pure-torch twin (the packed rows expanded through ``slot``, then ``ragged_attention_ref``).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import _common
from ._common import dot_precision, expect, interpreting, tl_dtype
from .attention import _launch_block_kernel, _walk_prefix
from .attention_checks import (_check_block_inputs, _check_last_contig, _check_tuning,
                               check_pool_and_requests)
from .attention_launch import _check_tile_config, prefix_splits
from .attention_tuning import AttentionTuning
from .interpreter_bf16 import refuse_broken_bf16

__all__ = ["folded_ragged_attention", "packed_prefix_states", "packed_config"]


@triton.jit
def _packed_prefix_kernel(
    q_ptr, rows_ptr, kpool_ptr, vpool_ptr, bounds_ptr, slots_ptr, lens_ptr, o_ptr, lse_ptr, scale,
    P, B, NREQ, CAP, CHUNK,
    stride_qr, stride_qh,
    stride_kps, stride_kph, stride_kpp,
    stride_vps, stride_vph, stride_vpp,
    stride_os, stride_or, stride_oh,
    stride_ls, stride_lr, stride_lh,
    G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_REQ: tl.constexpr, DOT_T: tl.constexpr, PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    mi = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row = mi // G  # packed row
    head = kvh * G + mi % G
    mvalid = row < P
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    row64 = row.to(tl.int64)
    flat = tl.load(rows_ptr + row64, mask=mvalid, other=0)
    # a packed row past the first holding flat position 0 is padding (the first request's main position is
    # always computed, so packed first): no state, nothing walked
    mvalid = mvalid & ((row == 0) | (flat != 0))
    # each packed row's request: how many requests' rows end at or before its row n = rows[p] // B
    n = flat // B
    rr = tl.arange(0, BLOCK_REQ)
    rvalid = rr < NREQ
    ends = tl.load(bounds_ptr + 1 + rr, mask=rvalid, other=0)
    req = tl.sum(((ends[None, :] <= n[:, None]) & rvalid[None, :]).to(tl.int32), axis=1)
    req = tl.minimum(req, NREQ - 1)
    q = tl.load(q_ptr + row64[:, None] * stride_qr + head[:, None] * stride_qh + dd[None, :],
                mask=mvalid[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    q_dot = q.to(DOT_T)
    o_rows = o_ptr + split.to(tl.int64) * stride_os + row64[:, None] * stride_or + head[:, None] * stride_oh
    lse_rows = lse_ptr + split.to(tl.int64) * stride_ls + row64 * stride_lr + head * stride_lh
    r_lo = tl.min(tl.where(mvalid, req, NREQ), axis=0)
    r_hi = tl.max(tl.where(mvalid, req, -1), axis=0)
    # the tile's requests (usually one): each walk writes the states of its own request's rows only, so
    # every valid row is written once and no second accumulator is kept
    for r in range(r_lo, r_hi + 1):
        slot = tl.load(slots_ptr + r).to(tl.int64)
        p_lo = split * CHUNK
        p_hi = tl.minimum(p_lo + CHUNK, tl.minimum(tl.load(lens_ptr + r), CAP).to(tl.int32))
        m_i, l_i, acc = _walk_prefix(q_dot, kpool_ptr + slot * stride_kps + kvh * stride_kph,
                                     vpool_ptr + slot * stride_vps + kvh * stride_vph, stride_kpp, stride_vpp,
                                     p_lo, p_hi, scale, dd, dmask, BLOCK_M, BLOCK_P, BLOCK_D, DOT_T, PREC)
        mine = mvalid & (req == r)
        has = l_i > 0.0  # an empty range (past the length) is the empty state
        o = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(o_rows + dd[None, :], o, mask=mine[:, None] & dmask[None, :])
        tl.store(lse_rows, lse, mask=mine)


def packed_config() -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_P, num_warps, num_stages) of the packed prefix kernel: tiles of 64 (packed row,
    query head) pairs over 64-key tiles on the GPU, as ``ragged_attention.ragged_config``'s largest."""
    if interpreting():
        return 16, 16, 4, 2
    return 64, 64, 4, 3


def _check_inputs(q_p, k_p, v_p, rows, slot, k_pool, v_pool, bounds, slots, lengths) -> None:
    """Shapes, dtypes and devices (metadata only: the index tensors' values stay on the device)."""
    _check_block_inputs(q_p, k_p, v_p, slot)
    P = q_p.shape[0]
    Hkv = k_p.shape[1]
    expect(isinstance(rows, torch.Tensor) and rows.dtype in (torch.int32, torch.int64) and rows.shape == (P,)
           and rows.device == q_p.device, "rows", f"an integer tensor [{P}] on {q_p.device} (each packed row's "
           "flat position n * B + b)", f"{getattr(rows, 'dtype', type(rows).__name__)} "
           f"{tuple(getattr(rows, 'shape', ()))}")
    check_pool_and_requests(q_p, "q_p", Hkv, k_pool, v_pool, bounds, slots, lengths)
    _check_last_contig(q_p=q_p, k_p=k_p, v_p=v_p, k_pool=k_pool, v_pool=v_pool)


def packed_prefix_states(q_p: torch.Tensor, rows: torch.Tensor, B: int, k_pool: torch.Tensor, v_pool: torch.Tensor,
                         bounds: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor, scale: float,
                         splits: int = 1, config: tuple[int, int, int, int] | None = None):
    """Each packed row's prefix state over its request's pool prefix (step 1 of the module docstring):
    o float32 [splits, P, Hq, D], lse float32 [splits, P, Hq], split ``s`` holding the keys of capacity
    range ``s`` (an empty state, o = 0 and lse = -inf, past the request's length). Inputs as
    ``folded_ragged_attention`` (checked there)."""
    P, Hq, D = q_p.shape
    Hkv = k_pool.shape[1]
    G = Hq // Hkv
    cap = k_pool.shape[2]
    BLOCK_M, BLOCK_P, num_warps, num_stages = packed_config() if config is None else config
    o = _common.empty((splits, P, Hq, D), torch.float32, q_p.device)
    lse = _common.empty((splits, P, Hq), torch.float32, q_p.device)
    if P == 0:
        return o, lse
    n_req = slots.shape[0]
    chunk = triton.cdiv(triton.cdiv(max(cap, 1), splits), BLOCK_P) * BLOCK_P  # whole key tiles per split
    _packed_prefix_kernel[(triton.cdiv(P * G, BLOCK_M), Hkv, splits)](
        q_p, rows.contiguous(), k_pool, v_pool, bounds.contiguous(), slots.contiguous(), lengths.contiguous(),
        o, lse, float(scale), P, B, n_req, cap, chunk,
        q_p.stride(0), q_p.stride(1),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        lse.stride(0), lse.stride(1), lse.stride(2),
        G=G, D=D, BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_M=BLOCK_M, BLOCK_P=BLOCK_P,
        BLOCK_REQ=max(2, triton.next_power_of_2(n_req)), DOT_T=tl_dtype(q_p.dtype), PREC=dot_precision(q_p.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )
    return o, lse


@functools.lru_cache(maxsize=4096)
def _splits(P: int, Hq: int, Hkv: int, positions: int, capacity: int, block_m: int, block_p: int,
            device: torch.device, tuning: AttentionTuning, interpreted: bool) -> int:
    """The prefix split count of ``P`` packed rows in tiles of ``block_m`` (row, query head) pairs over a
    pool of ``capacity`` keys, ``positions`` positions merging the states (``attention_launch.prefix_splits``;
    shapes only), kept per shape: a launched engine asks once a layer a step (``interpreted`` keys the cache
    by what ``prefix_splits`` reads)."""
    programs = triton.cdiv(P * (Hq // Hkv), block_m) * Hkv
    return prefix_splits(programs, capacity, block_p, device, positions * Hq, tuning=tuning)


def folded_ragged_attention(q_p: torch.Tensor, k_p: torch.Tensor, v_p: torch.Tensor, rows: torch.Tensor,
                            slot: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, bounds: torch.Tensor,
                            slots: torch.Tensor, lengths: torch.Tensor, scale: float, splits: int | None = None,
                            config: tuple[int, int, int, int] | None = None,
                            tuning: AttentionTuning | None = None) -> torch.Tensor:
    """Every position's verification attention from the packed rows (module docstring).

    q_p [P, Hq, D], k_p, v_p [P, Hkv, D] (last dim contiguous): the computed positions' q, k, v; rows int
    [P]: packed row ``p``'s flat position ``n * B + b``, the computed positions first (position 0, the first
    request's main one, is always computed, and packed first) and then zeros (padding up to a fixed
    capacity, as the gates leave it: skipped, no state written); slot int64 [R, B]: the packed row each position
    reads (its origin, a position of the same request); k_pool, v_pool [S, Hkv, C, D], bounds int [n + 1],
    slots int [n], lengths int [n]: as ``ragged_attention``. Returns [R, B, Hq, D] in q_p.dtype, equal to
    ``ragged_attention(q_p[slot], k_p[slot], v_p[slot], ...)`` up to float rounding.

    ``splits``: how many ranges of the capacity the prefix walk is cut into (None: from the shapes under
    ``tuning``, as ``ragged_attention.ragged_splits``; 1 without one); ``config``: (BLOCK_M, BLOCK_P,
    num_warps, num_stages) of the prefix kernel instead of ``packed_config``."""
    _check_inputs(q_p, k_p, v_p, rows, slot, k_pool, v_pool, bounds, slots, lengths)
    refuse_broken_bf16(q_p.dtype, "folded ragged attention")
    _check_tuning(tuning, needed=False)
    if config is not None:
        _check_tile_config(config)
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
        raise ValueError(f"splits: expected None or an int >= 1, got {splits!r}")
    P, Hq, _ = q_p.shape
    Hkv = k_p.shape[1]
    if splits is None:
        block_m, block_p = (packed_config() if config is None else config)[:2]
        splits = 1 if tuning is None else _splits(P, Hq, Hkv, slot.numel(), k_pool.shape[2], block_m, block_p,
                                                  q_p.device, tuning, interpreting())
    states = packed_prefix_states(q_p, rows, int(slot.shape[1]), k_pool, v_pool, bounds, slots, lengths, scale,
                                  splits, config)
    return _launch_block_kernel(q_p, k_p, v_p, slot, scale, states=states)
