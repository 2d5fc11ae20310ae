"""Triton ragged-prefix branch attention: the attention of a batched verification forward over several
requests in one launch, each request's rows against that request's own prefix in the serving engine's
KV pool.

The rows of all requests are concatenated, ``q [R, B, Hq, D]``, ``k, v [R, B, Hkv, D]``; request ``i``
owns rows ``[bounds[i], bounds[i + 1])``, its prefix being the first ``lengths[i]`` positions of pool
slot ``slots[i]`` (``k_pool, v_pool [S, Hkv, C, D]``, one layer's buffers, read in place: no copy, no
gather). Every row (branch) attends to its request's prefix and to its own block of ``B`` keys,
bidirectionally as ``branch_attention`` does (``causal=True``: block key ``j`` only for position
``b >= j``, as a block write of the NLD family attends to itself). ``bounds``, ``slots`` and ``lengths``
are device tensors the kernel loads itself: no host read, nothing that syncs, and the launch depends on
the shapes only.

One program takes one row, one tile of its ``B * G`` (position, query head) pairs and one kv head (the
GQA group shares each K/V tile load, as in ``attention.py``): it finds its request from ``bounds``, walks
the ``min(lengths[i], C)`` prefix keys of its slot and goes on over its block in the same online
softmax (``attention._walk_prefix``), so a row of an empty prefix simply starts at its block: one launch,
no states. A request's prefix is walked once per row (branch), which keeps a launch busy when many
requests verify at once. For few rows over long prefixes the walk can be split (flash-decoding, as
``attention.prefix_attention_states``): the same launch with ``STATES`` writes one (o, lse) state per
range of the capacity and row, and ``attention.py``'s block kernel merges them with the row's block (a
second launch). The split count comes from the shapes and the capacity (``ragged_splits``), never the
lengths; ranges past a request's length are empty states. ``bench/kernels/bench_ragged_attention.py``
compares the kernel with ``branch_attention`` run per request. The request count enters the kernel
rounded up to a power of two (the width of the ``bounds`` search), so a new power of two compiles it
once more.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import _common
from ._common import dot_precision, expect, interpreting, tl_dtype
from .attention import _launch_block_kernel, _position_tile, _walk_prefix
from .attention_checks import _check_last_contig, _check_tuning, check_pool_and_requests
from .attention_launch import _check_tile_config, prefix_splits
from .attention_tuning import AttentionTuning
from .interpreter_bf16 import refuse_broken_bf16


@triton.jit
def _ragged_attn_kernel(
    q_ptr, k_ptr, v_ptr, kpool_ptr, vpool_ptr, bounds_ptr, slots_ptr, lens_ptr, out_ptr, o_ptr, lse_ptr, scale,
    B, N_MT, NREQ, CAP, CHUNK,
    stride_qn, stride_qb, stride_qh,
    stride_kn, stride_kb, stride_kh,
    stride_vn, stride_vb, stride_vh,
    stride_kps, stride_kph, stride_kpp,
    stride_vps, stride_vph, stride_vpp,
    stride_on, stride_ob, stride_oh,
    stride_os, stride_or, stride_ohs,
    stride_ls, stride_lr, stride_lh,
    STATES: tl.constexpr, CAUSAL: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_REQ: tl.constexpr,
    DOT_T: tl.constexpr, PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1).to(tl.int64)
    n = pid // N_MT
    mt = pid % N_MT
    # the row's request: how many row groups end at or before it (bounds[0] = 0, non-decreasing)
    rr = tl.arange(0, BLOCK_REQ)
    rvalid = rr < NREQ
    ends = tl.load(bounds_ptr + 1 + rr, mask=rvalid, other=0)
    req = tl.sum(((ends <= n) & rvalid).to(tl.int32), axis=0)
    req = tl.minimum(req, NREQ - 1)
    slot = tl.load(slots_ptr + req).to(tl.int64)
    p_len = tl.minimum(tl.load(lens_ptr + req), CAP).to(tl.int32)
    n64 = n.to(tl.int64)
    b, head, mvalid, dd, dmask, qmask = _position_tile(mt, kvh, B, G, D, BLOCK_M, BLOCK_D)
    q = tl.load(q_ptr + n64 * stride_qn + b[:, None] * stride_qb + head[:, None] * stride_qh + dd[None, :],
                mask=qmask, other=0.0).to(tl.float32)
    q_dot = q.to(DOT_T)
    p_lo = 0
    p_hi = p_len
    if STATES:  # this program's split of the prefix: keys [p_lo, p_hi)
        p_lo = tl.program_id(2) * CHUNK
        p_hi = tl.minimum(p_lo + CHUNK, p_len)
    m_i, l_i, acc = _walk_prefix(q_dot, kpool_ptr + slot * stride_kps + kvh * stride_kph,
                                 vpool_ptr + slot * stride_vps + kvh * stride_vph, stride_kpp, stride_vpp,
                                 p_lo, p_hi, scale, dd, dmask, BLOCK_M, BLOCK_P, BLOCK_D, DOT_T, PREC)
    if STATES:  # the split's state (o, lse) of row (n, b), for attention.block_attention to merge
        has = l_i > 0.0
        o_s = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        split = tl.program_id(2).to(tl.int64)
        row = n64 * B + b.to(tl.int64)
        tl.store(o_ptr + split * stride_os + row[:, None] * stride_or + head[:, None] * stride_ohs + dd[None, :],
                 o_s, mask=qmask)
        tl.store(lse_ptr + split * stride_ls + row * stride_lr + head * stride_lh, lse, mask=mvalid)
    else:  # the row's own block, in the same online softmax
        jj = tl.arange(0, BLOCK_J)
        jmask = jj < B
        kv_mask = jmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + n64 * stride_kn + jj[:, None] * stride_kb + kvh * stride_kh + dd[None, :],
                    mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + n64 * stride_vn + jj[:, None] * stride_vb + kvh * stride_vh + dd[None, :],
                    mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.dot(q_dot, tl.trans(k.to(DOT_T)), input_precision=PREC) * scale
        allowed = jmask[None, :]
        if CAUSAL:
            allowed = allowed & (jj[None, :] <= b[:, None])
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: key 0 is allowed for every position
        alpha = tl.exp(m_i - m_new)  # 0 after an empty prefix (m_i = -inf)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_T), v.to(DOT_T), input_precision=PREC)
        o = acc / l_i[:, None]  # l_i >= 1: the row's own maximum contributes exp(0)
        out_off = n64 * stride_on + b.to(tl.int64)[:, None] * stride_ob + head[:, None] * stride_oh + dd[None, :]
        tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty), mask=qmask)


def ragged_config(rows_per_tile: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_P, num_warps, num_stages) for a tile of at most ``rows_per_tile`` = B * G
    (position, query head) pairs: the prefix kernel's GPU tiles (``attention_launch._prefix_config``),
    BLOCK_M no larger than a row needs."""
    if interpreting():
        return 16, 16, 4, 2
    return min(64, max(16, triton.next_power_of_2(rows_per_tile))), 64, 4, 3


def _inputs_ok(q, k, v, k_pool, v_pool, bounds, slots, lengths) -> bool:
    """Every check of ``check_ragged_inputs`` at once, building no message: the launch's fast path (the
    engine launches once a layer a step). False hands over to the checks that say what is wrong."""
    if q.dim() != 4 or k.dim() != 4 or k_pool.dim() != 4:
        return False
    R, B, Hq, D = q.shape
    Hkv = k.shape[2]
    if not (k.shape[:2] == (R, B) and k.shape[3] == D and Hkv >= 1 and Hq % Hkv == 0 and v.shape == k.shape
            and k_pool.shape[1] == Hkv and k_pool.shape[3] == D and v_pool.shape == k_pool.shape):
        return False
    for t in (q, k, v, k_pool, v_pool):
        if t.dtype != q.dtype or t.device != q.device or not (t.stride(-1) == 1 or t.shape[-1] == 1):
            return False
    if not isinstance(bounds, torch.Tensor) or bounds.dim() != 1 or bounds.shape[0] < 2:
        return False
    n_req = bounds.shape[0] - 1
    return all(isinstance(t, torch.Tensor) and t.dtype in (torch.int32, torch.int64) and t.dim() == 1
               and t.shape[0] == size and t.device == q.device
               for t, size in ((bounds, n_req + 1), (slots, n_req), (lengths, n_req)))


def check_ragged_inputs(q, k, v, k_pool, v_pool, bounds, slots, lengths):
    """Shape, dtype and device checks of ``ragged_attention`` (metadata only: the index tensors stay on the
    device). Returns the index tensors contiguous."""
    if not _inputs_ok(q, k, v, k_pool, v_pool, bounds, slots, lengths):
        _explain_bad_inputs(q, k, v, k_pool, v_pool, bounds, slots, lengths)
    return bounds.contiguous(), slots.contiguous(), lengths.contiguous()


def _explain_bad_inputs(q, k, v, k_pool, v_pool, bounds, slots, lengths) -> None:
    """The first failing check of ``check_ragged_inputs``, as the one-line error naming its argument."""
    expect(q.dim() == 4, "q", "[R, B, Hq, D]", tuple(q.shape))
    R, B, Hq, D = q.shape
    expect(k.dim() == 4 and k.shape[:2] == (R, B) and k.shape[-1] == D and k.shape[2] >= 1
           and Hq % k.shape[2] == 0, "k", f"[{R}, {B}, Hkv, {D}] with Hkv dividing Hq = {Hq}", tuple(k.shape))
    expect(v.shape == k.shape, "v", f"k's shape {tuple(k.shape)}", tuple(v.shape))
    for name, t in (("k", k), ("v", v)):
        expect(t.dtype == q.dtype, name, f"q's dtype {q.dtype}", t.dtype)
        expect(t.device == q.device, name, f"q's device {q.device}", t.device)
    check_pool_and_requests(q, "q", k.shape[2], k_pool, v_pool, bounds, slots, lengths)
    _check_last_contig(q=q, k=k, v=v, k_pool=k_pool, v_pool=v_pool)


def ragged_splits(R: int, B: int, q_heads: int, kv_heads: int, capacity: int, device: torch.device,
                  tuning: AttentionTuning) -> int:
    """How many splits ``ragged_attention`` cuts the prefix capacity into for R rows of B positions (shapes
    only: the same launches for any lengths): ``attention_launch.prefix_splits`` under ``tuning`` for the
    R * B * G (position, query head) pairs in tiles of ``ragged_config``; one off the GPU, under the
    interpreter and for short capacities."""
    G = q_heads // kv_heads
    block_m, block_p = ragged_config(B * G)[:2]
    programs = R * triton.cdiv(B * G, block_m) * kv_heads
    return prefix_splits(programs, capacity, block_p, device, R * B * q_heads, tuning=tuning)


@functools.lru_cache(maxsize=4096)
def _splits(R: int, B: int, q_heads: int, kv_heads: int, capacity: int, device: torch.device,
            tuning: AttentionTuning, interpreted: bool) -> int:
    """``ragged_splits``, kept per shape: the engine asks once a layer a step for a handful of shapes
    (``interpreted`` keys the cache by what ``ragged_config`` reads)."""
    return ragged_splits(R, B, q_heads, kv_heads, capacity, device, tuning)


def ragged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor,
                     v_pool: torch.Tensor, bounds: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor,
                     scale: float, causal: bool = False, splits: int | None = None,
                     config: tuple[int, int, int, int] | None = None,
                     tuning: AttentionTuning | None = None) -> torch.Tensor:
    """Attention of the concatenated rows of several requests, each against its own pool prefix (module
    docstring).

    q [R, B, Hq, D], k, v [R, B, Hkv, D] (strided ok, last dim contiguous); k_pool, v_pool [S, Hkv, C, D]
    (one layer of the ``KVPool``); bounds int [n + 1] (row offsets: 0 = bounds[0] <= ... <= bounds[n] = R,
    a request may own no rows); slots int [n] (each request's pool slot); lengths int [n] (its prefix
    length, 0 allowed; past C it counts as C). The three index tensors live on q's device and their
    values are not checked (that would read them back). ``causal``: block key j only for positions
    b >= j. Returns [R, B, Hq, D] in q.dtype: row r of request i equals
    ``branch_attention(q[r], k[r], v[r], k_pool[slots[i], :, :lengths[i]], ...)`` (its row of it).

    ``splits``: 1 walks each row's prefix and block in one launch; S > 1 cuts the capacity C into S
    ranges, one launch writing a state per range and row and ``attention.block_attention``'s kernel
    merging them with the block (a second launch; more programs for few rows over long prefixes; not
    with ``causal``). None: ``ragged_splits`` under ``tuning`` (e.g. ``H200.attention`` of
    ``ops.device_profile``; 1 with ``causal`` or without a ``tuning``). ``config``: (BLOCK_M,
    BLOCK_P, num_warps, num_stages) instead of ``ragged_config`` (the benchmark)."""
    bounds, slots, lengths = check_ragged_inputs(q, k, v, k_pool, v_pool, bounds, slots, lengths)
    refuse_broken_bf16(q.dtype, "ragged attention")
    if config is not None:
        _check_tile_config(config)
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
        raise ValueError(f"splits: expected None or an int >= 1, got {splits!r}")
    if causal and splits is not None and splits > 1:
        raise ValueError(f"splits: causal attention runs in one pass (splits=1 or None), got {splits}")
    R, B, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    cap = k_pool.shape[2]
    _check_tuning(tuning, needed=False)
    if splits is None:
        splits = 1 if causal or tuning is None else _splits(R, B, Hq, Hkv, cap, q.device, tuning, interpreting())
    out = _common.empty((R, B, Hq, D), q.dtype, q.device)
    if R == 0 or B == 0:
        return out
    BLOCK_M, BLOCK_P, num_warps, num_stages = ragged_config(B * G) if config is None else config
    n_mt = triton.cdiv(B * G, BLOCK_M)
    n_req = slots.shape[0]
    states = splits > 1
    if states:
        o_st = _common.empty((splits, R * B, Hq, D), torch.float32, q.device)
        lse_st = _common.empty((splits, R * B, Hq), torch.float32, q.device)
        state_strides = (o_st.stride(0), o_st.stride(1), o_st.stride(2),
                         lse_st.stride(0), lse_st.stride(1), lse_st.stride(2))
    else:
        o_st = lse_st = out  # unused
        state_strides = (0,) * 6
    chunk = triton.cdiv(triton.cdiv(max(cap, 1), splits), BLOCK_P) * BLOCK_P  # whole key tiles per split
    _ragged_attn_kernel[(R * n_mt, Hkv, splits)](
        q, k, v, k_pool, v_pool, bounds, slots, lengths, out, o_st, lse_st, float(scale),
        B, n_mt, n_req, cap, chunk,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        *state_strides,
        STATES=states, CAUSAL=bool(causal), G=G, D=D, BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_M=BLOCK_M,
        BLOCK_J=max(16, triton.next_power_of_2(B)), BLOCK_P=BLOCK_P,
        BLOCK_REQ=max(2, triton.next_power_of_2(n_req)), DOT_T=tl_dtype(q.dtype), PREC=dot_precision(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )
    if not states:
        return out
    # every (n, b) attends over its own branch's block and merges the S states of its row: the block kernel
    # of branch_attention, the rows flattened (n * B + b) with the identity slot map
    slot = torch.arange(R * B, device=q.device, dtype=torch.int64).view(R, B)
    return _launch_block_kernel(q.reshape(R * B, Hq, D), k.reshape(R * B, Hkv, D), v.reshape(R * B, Hkv, D), slot,
                                scale, states=(o_st, lse_st))
