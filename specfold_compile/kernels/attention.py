"""Triton folded attention: prefix attention with (o, lse) states, block attention through the
origin map merged with the prefix state, and dense branch attention built from the two. For short
prefixes and few rows the block kernel walks the prefix itself instead (one pass, one launch, no
states; ``use_one_pass``), which is cheaper there than two launches.

The prefix part is split along the prefix (flash-decoding): a verification call has few query rows
(32 a branch), so one program per row tile leaves most of the GPU idle while it walks the whole
prefix. Each split writes its own (o, lse) state and the block kernel, which merges the prefix state
into the block's anyway, merges all of them; no extra launch.

Layout of a program's M dimension: the GQA group's query heads and a tile of rows are flattened
together (m -> row = m // G, head = kv_head * G + m % G), so all query heads of the group share
one K/V tile load and the group size needs no power-of-two padding. Natural-log LSE, fp32 states.
Every load is converted to fp32 at once; dot operands are cast back to the storage dtype right
before ``tl.dot`` (exact, because they came from that dtype), except the softmax weights P, which
are rounded to the storage dtype for the PV product as in FlashAttention.

``prefix_len``: the decode loop replays CUDA graphs over a prefix cache of fixed capacity [Hkv, P_cap, D]
whose first L keys are valid, L changing between replays. So L comes as a one-element device tensor that
the kernels load themselves (no host read, nothing that syncs) and keys >= L take no part; every host-side
decision (split count, one pass or two kernels, tiles) is made from the capacity P, so a captured graph
replays the same launches for any length.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import _common

from ._common import dot_precision, expect, interpreting, tl_dtype
from .attention_checks import (_check_block_inputs, _check_last_contig, _check_prefix_inputs, _check_prefix_len,
                               _check_tuning)
from .attention_launch import _check_tile_config, _one_pass_config, _prefix_config, prefix_splits, use_one_pass
from .attention_tuning import AttentionTuning


@triton.jit
def _walk_prefix(q_dot, k_base, v_base, stride_kp, stride_vp, p_lo, p_hi, scale, dd, dmask,
                 BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr, DOT_T: tl.constexpr,
                 PREC: tl.constexpr):
    """Online softmax of the query tile over keys [p_lo, p_hi) of one kv head: (running max, running
    sum, unnormalised output), all float32. Every tile has a valid key, so the running max stays finite
    after the first tile (no exp(-inf - -inf))."""
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for p0 in range(p_lo, p_hi, BLOCK_P):
        pp = p0 + tl.arange(0, BLOCK_P)
        pmask = pp < p_hi
        kv_mask = pmask[:, None] & dmask[None, :]
        k = tl.load(k_base + pp[:, None].to(tl.int64) * stride_kp + dd[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.dot(q_dot, tl.trans(k.to(DOT_T)), input_precision=PREC) * scale
        s = tl.where(pmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + pp[:, None].to(tl.int64) * stride_vp + dd[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_T), v.to(DOT_T), input_precision=PREC)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _position_tile(mt, kvh, B, G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Tile ``mt`` of a branch's B * G (position, query head) pairs of kv head ``kvh``: (position b, query
    head, b < B, the head-dim offsets, their mask, the [BLOCK_M, BLOCK_D] load mask)."""
    mi = mt * BLOCK_M + tl.arange(0, BLOCK_M)
    b = mi // G
    head = kvh * G + mi % G
    mvalid = b < B
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    return b, head, mvalid, dd, dmask, mvalid[:, None] & dmask[None, :]


@triton.jit
def _prefix_attn_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, count_ptr, plen_ptr, scale,
    R, P, CHUNK, M_TILES, HKV, SPLITS,
    stride_qr, stride_qh,
    stride_kh, stride_kp,
    stride_vh, stride_vp,
    stride_os, stride_or, stride_oh,
    stride_ls, stride_lr, stride_lh,
    HAS_COUNT: tl.constexpr, HAS_PREFIX_LEN: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, DOT_T: tl.constexpr,
    PREC: tl.constexpr, ROW_TILES_OUTER: tl.constexpr,
):
    # One flat grid. ROW_TILES_OUTER: the row tile is the slowest index, so the programs that have rows
    # below the device-side count come first in launch order and each gets an SM of its own, instead
    # of sharing SMs with the row tiles of another head or split while others idle.
    lin = tl.program_id(0)
    if ROW_TILES_OUTER:
        kvh = lin % HKV
        split = (lin // HKV) % SPLITS
        pid = lin // (HKV * SPLITS)
    else:
        pid = lin % M_TILES
        kvh = (lin // M_TILES) % HKV
        split = lin // (M_TILES * HKV)
    kvh = kvh.to(tl.int64)
    P_eff = P
    if HAS_PREFIX_LEN:
        # only the first min(P, length) keys are valid (the splits were cut from the capacity P: those
        # wholly past the length walk nothing and write the empty state)
        P_eff = tl.minimum(tl.load(plen_ptr), P).to(tl.int32)
    p_lo = split * CHUNK  # this program's keys: [p_lo, p_hi)
    p_hi = tl.minimum(p_lo + CHUNK, P_eff)
    m0 = pid * BLOCK_M
    if HAS_COUNT:
        cnt = tl.load(count_ptr)
        if m0 // G >= cnt:
            return
    mi = m0 + tl.arange(0, BLOCK_M)
    row = mi // G
    head = kvh * G + mi % G
    mvalid = row < R
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    row64 = row.to(tl.int64)
    q = tl.load(q_ptr + row64[:, None] * stride_qr + head[:, None] * stride_qh + dd[None, :],
                mask=mvalid[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    q_dot = q.to(DOT_T)
    m_i, l_i, acc = _walk_prefix(q_dot, k_ptr + kvh * stride_kh, v_ptr + kvh * stride_vh, stride_kp, stride_vp,
                                 p_lo, p_hi, scale, dd, dmask, BLOCK_M, BLOCK_P, BLOCK_D, DOT_T, PREC)
    has = l_i > 0.0
    o = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    split64 = split.to(tl.int64)
    tl.store(o_ptr + split64 * stride_os + row64[:, None] * stride_or + head[:, None] * stride_oh + dd[None, :],
             o, mask=mvalid[:, None] & dmask[None, :])
    tl.store(lse_ptr + split64 * stride_ls + row64 * stride_lr + head * stride_lh, lse, mask=mvalid)


@triton.jit
def _block_attn_kernel(
    q_ptr, k_ptr, v_ptr, slot_ptr, opre_ptr, lsepre_ptr, kpre_ptr, vpre_ptr, plen_ptr, out_ptr, scale,
    B, N_MT, S, P,
    stride_qr, stride_qh,
    stride_kr, stride_kh,
    stride_vr, stride_vh,
    stride_sn,
    stride_ps, stride_pr, stride_ph,
    stride_ls, stride_lr, stride_lh,
    stride_kph, stride_kpp,
    stride_vph, stride_vpp,
    stride_on, stride_ob, stride_oh,
    WALK_PREFIX: tl.constexpr, HAS_PREFIX_LEN: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_P: tl.constexpr,
    DOT_T: tl.constexpr, PREC: tl.constexpr,
):
    # WALK_PREFIX: one pass, each (n, b) walks the P prefix keys itself (a folded row repeats its
    # origin's walk: same query, same keys) and goes on over its branch's block in the same online
    # softmax; HAS_PREFIX_LEN: only the first min(P, length) of them. Otherwise the prefix comes as S
    # precomputed (o, lse) states of the origin row, merged in (the prefix kernel applied the length).
    pid = tl.program_id(0)
    kvh = tl.program_id(1).to(tl.int64)
    n = (pid // N_MT).to(tl.int64)
    mt = pid % N_MT
    b, head, mvalid, dd, dmask, qmask = _position_tile(mt, kvh, B, G, D, BLOCK_M, BLOCK_D)
    # query rows through the origin map
    qrow = tl.load(slot_ptr + n * stride_sn + b, mask=mvalid, other=0)
    q = tl.load(q_ptr + qrow[:, None] * stride_qr + head[:, None] * stride_qh + dd[None, :],
                mask=qmask, other=0.0).to(tl.float32)
    if WALK_PREFIX:
        P_eff = P
        if HAS_PREFIX_LEN:
            P_eff = tl.minimum(tl.load(plen_ptr), P).to(tl.int32)
        m_i, l_i, acc = _walk_prefix(q.to(DOT_T), kpre_ptr + kvh * stride_kph, vpre_ptr + kvh * stride_vph,
                                     stride_kpp, stride_vpp, 0, P_eff, scale, dd, dmask,
                                     BLOCK_M, BLOCK_P, BLOCK_D, DOT_T, PREC)
    # the branch's own block: keys/values of (n, j) through the origin map
    jj = tl.arange(0, BLOCK_J)
    jmask = jj < B
    krow = tl.load(slot_ptr + n * stride_sn + jj, mask=jmask, other=0)
    kv_mask = jmask[:, None] & dmask[None, :]
    k = tl.load(k_ptr + krow[:, None] * stride_kr + kvh * stride_kh + dd[None, :], mask=kv_mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + krow[:, None] * stride_vr + kvh * stride_vh + dd[None, :], mask=kv_mask, other=0.0).to(tl.float32)
    s = tl.dot(q.to(DOT_T), tl.trans(k.to(DOT_T)), input_precision=PREC) * scale
    s = tl.where(jmask[None, :], s, float("-inf"))
    m_b = tl.max(s, axis=1)  # finite: B >= 1 keys, and rows past B have q = 0
    if WALK_PREFIX:
        m_new = tl.maximum(m_i, m_b)
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_T), v.to(DOT_T), input_precision=PREC)
        o = acc / l_i[:, None]  # l_i >= 1: the row's own maximum contributes exp(0)
    else:
        m_b = tl.where(mvalid, m_b, 0.0)
        p = tl.exp(s - m_b[:, None])
        l_b = tl.sum(p, axis=1)
        acc = tl.dot(p.to(DOT_T), v.to(DOT_T), input_precision=PREC)
        l_safe = tl.where(l_b > 0.0, l_b, 1.0)
        o_blk = acc / l_safe[:, None]
        lse_blk = tl.where(l_b > 0.0, m_b + tl.log(l_safe), float("-inf"))
        # merge with the S prefix states of the origin row (attention_ref.merge_states, over S + 1 states):
        # the largest lse first, then weights, then the weighted outputs (a zero weight lets nothing through)
        lse_base = lsepre_ptr + qrow * stride_lr + head * stride_lh
        o_base = opre_ptr + qrow[:, None] * stride_pr + head[:, None] * stride_ph + dd[None, :]
        m = lse_blk
        for s_i in range(S):
            lse_s = tl.load(lse_base + s_i * stride_ls, mask=mvalid, other=float("-inf")).to(tl.float32)
            m = tl.maximum(m, lse_s)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        w_blk = tl.exp(lse_blk - m_safe)
        den = w_blk
        acc_o = tl.where(w_blk[:, None] > 0.0, w_blk[:, None] * o_blk, 0.0)
        for s_i in range(S):
            lse_s = tl.load(lse_base + s_i * stride_ls, mask=mvalid, other=float("-inf")).to(tl.float32)
            w_s = tl.exp(lse_s - m_safe)
            o_s = tl.load(o_base + s_i * stride_ps, mask=qmask, other=0.0).to(tl.float32)
            acc_o += tl.where(w_s[:, None] > 0.0, w_s[:, None] * o_s, 0.0)
            den += w_s
        ok = den > 0.0
        o = acc_o * tl.where(ok, 1.0 / tl.where(ok, den, 1.0), 0.0)[:, None]
    out_off = n * stride_on + b.to(tl.int64)[:, None] * stride_ob + head[:, None] * stride_oh + dd[None, :]
    tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty), mask=qmask)


def prefix_attention_states(q: torch.Tensor, k_pre: torch.Tensor, v_pre: torch.Tensor, scale: float,
                            count: torch.Tensor | None = None, splits: int | None = None,
                            config: tuple[int, int, int, int] | None = None, row_tiles_outer: bool = True,
                            prefix_len: torch.Tensor | None = None, tuning: AttentionTuning | None = None):
    """q [R,Hq,D] (strided ok, last dim contiguous); k_pre, v_pre [Hkv,P,D] (strided views ok).
    Returns S states over consecutive key ranges of the prefix: (o [S,R,Hq,D] float32, lse [S,R,Hq]
    float32, natural log); merged (attention_ref.merge_states) they are the attention over the whole
    prefix. ``splits``: S (None: ``prefix_splits`` under ``tuning``, which with a ``count`` assumes
    ``tuning.folded_rows_guess`` of the rows compute; one of the two is needed). With `count` (int64 0-d device tensor), rows >=
    count are skipped (their outputs are unspecified). ``config``: (BLOCK_M, BLOCK_P, num_warps,
    num_stages) instead of the shape-based default (for the benchmark's sweep,
    ``bench/kernels/bench_attention.py --sweep``). ``row_tiles_outer=False``: row tiles fastest in
    launch order, kept for the sweep's comparison. ``prefix_len`` (int32/int64
    device tensor, one element): only keys [0, min(prefix_len, P)) take part, read by the kernel (a
    fixed-capacity cache under CUDA-graph replays); the splits are still cut from P, and those wholly
    past the length are empty states (o = 0, lse = -inf). None: all P keys."""
    expect(q.dim() == 3, "q", "[R, Hq, D]", tuple(q.shape))
    _check_prefix_inputs(q, k_pre, v_pre)
    _check_last_contig(q=q)
    _check_prefix_len(prefix_len, q)
    if config is not None:
        _check_tile_config(config)
    if splits is not None and (not isinstance(splits, int) or splits < 1):
        raise ValueError(f"splits: expected an int >= 1, got {splits!r}")
    _check_tuning(tuning, needed=splits is None)
    return _launch_prefix_kernel(q, k_pre, v_pre, scale, count, splits, config, row_tiles_outer, prefix_len,
                                 tuning)


def _launch_prefix_kernel(q, k_pre, v_pre, scale, count=None, splits=None, config=None, row_tiles_outer=True,
                          prefix_len=None, tuning=None):
    """``prefix_attention_states`` on checked inputs (everything decided here comes from the shapes, P
    being the capacity when a ``prefix_len`` is given)."""
    R, Hq, D = q.shape
    Hkv, P, _ = k_pre.shape
    G = Hq // Hkv
    BLOCK_M, BLOCK_P, num_warps, num_stages = _prefix_config(R * G, D) if config is None else config
    if splits is None:
        working = R if count is None else math.ceil(tuning.folded_rows_guess * R)
        splits = prefix_splits(triton.cdiv(working * G, BLOCK_M) * Hkv, P, BLOCK_P, q.device, R * Hq,
                               tuning=tuning)
    o = _common.empty((splits, R, Hq, D), torch.float32, q.device)
    lse = _common.empty((splits, R, Hq), torch.float32, q.device)
    if R == 0:
        return o, lse
    chunk = triton.cdiv(triton.cdiv(max(P, 1), splits), BLOCK_P) * BLOCK_P  # whole key tiles per split
    BLOCK_D = max(16, triton.next_power_of_2(D))
    m_tiles = triton.cdiv(R * G, BLOCK_M)
    _prefix_attn_kernel[(m_tiles * Hkv * splits,)](
        q, k_pre, v_pre, o, lse, count if count is not None else o, prefix_len if prefix_len is not None else o,
        float(scale),
        R, P, chunk, m_tiles, Hkv, splits,
        q.stride(0), q.stride(1),
        k_pre.stride(0), k_pre.stride(1),
        v_pre.stride(0), v_pre.stride(1),
        o.stride(0), o.stride(1), o.stride(2),
        lse.stride(0), lse.stride(1), lse.stride(2),
        HAS_COUNT=count is not None, HAS_PREFIX_LEN=prefix_len is not None, G=G, D=D, BLOCK_D=BLOCK_D,
        BLOCK_M=BLOCK_M, BLOCK_P=BLOCK_P, DOT_T=tl_dtype(q.dtype), PREC=dot_precision(q.dtype),
        ROW_TILES_OUTER=row_tiles_outer, num_warps=num_warps, num_stages=num_stages,
    )
    return o, lse


def prefix_attention(q: torch.Tensor, k_pre: torch.Tensor, v_pre: torch.Tensor, scale: float,
                     count: torch.Tensor | None = None, prefix_len: torch.Tensor | None = None):
    """The prefix state in one piece: (o [R,Hq,D] float32, lse [R,Hq] float32, natural log);
    ``prefix_attention_states`` with one split (``prefix_len``: the valid keys, as there)."""
    o, lse = prefix_attention_states(q, k_pre, v_pre, scale, count, splits=1, prefix_len=prefix_len)
    return o[0], lse[0]


def _launch_block_kernel(q, k, v, slot, scale, states=None, prefix=None, config=None, prefix_len=None):
    """The block kernel over every (n, b) of ``slot`` (inputs checked by the caller), merging S prefix
    ``states`` (o [S,R,Hq,D], lse [S,R,Hq]) or walking the ``prefix`` keys itself ((k_pre, v_pre)
    [Hkv,P,D]: one pass; with ``prefix_len``, only the first min(P, prefix_len) keys, loaded by the
    kernel). With states, ``prefix_len`` is unused: the prefix kernel applied it."""
    R, Hq, D = q.shape
    Hkv = k.shape[1]
    N, B = slot.shape
    G = Hq // Hkv
    out = _common.empty((N, B, Hq, D), q.dtype, q.device)
    if N == 0 or B == 0:
        return out
    BLOCK_J = max(16, triton.next_power_of_2(B))
    BLOCK_D = max(16, triton.next_power_of_2(D))
    walk = prefix is not None
    if walk:
        BLOCK_M, BLOCK_P, num_warps, num_stages = _one_pass_config() if config is None else config
        k_pre, v_pre = prefix
        o_pre = lse_pre = out  # unused
        S, P = 0, k_pre.shape[1]
        state_strides = (0, 0, 0, 0, 0, 0)
        kv_pre_strides = (k_pre.stride(0), k_pre.stride(1), v_pre.stride(0), v_pre.stride(1))
    else:
        BLOCK_P, num_stages = 16, 1
        if interpreting():
            BLOCK_M, num_warps = 16, 4
        else:
            BLOCK_M = min(128, max(16, triton.next_power_of_2(B * G)))
            num_warps = 4 if BLOCK_M <= 64 else 8
        o_pre, lse_pre = states
        k_pre = v_pre = o_pre  # unused
        S, P = o_pre.shape[0], 0
        state_strides = (o_pre.stride(0), o_pre.stride(1), o_pre.stride(2),
                         lse_pre.stride(0), lse_pre.stride(1), lse_pre.stride(2))
        kv_pre_strides = (0, 0, 0, 0)
    has_len = walk and prefix_len is not None
    n_mt = triton.cdiv(B * G, BLOCK_M)
    _block_attn_kernel[(N * n_mt, Hkv)](
        q, k, v, slot, o_pre, lse_pre, k_pre, v_pre, prefix_len if has_len else out, out, float(scale),
        B, n_mt, S, P,
        q.stride(0), q.stride(1),
        k.stride(0), k.stride(1),
        v.stride(0), v.stride(1),
        slot.stride(0),
        *state_strides,
        *kv_pre_strides,
        out.stride(0), out.stride(1), out.stride(2),
        WALK_PREFIX=walk, HAS_PREFIX_LEN=has_len, G=G, D=D, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, BLOCK_J=BLOCK_J,
        BLOCK_P=BLOCK_P,
        DOT_T=tl_dtype(q.dtype), PREC=dot_precision(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )
    return out


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot: torch.Tensor,
                    o_pre: torch.Tensor, lse_pre: torch.Tensor, scale: float) -> torch.Tensor:
    """q [R,Hq,D], k,v [R,Hkv,D] (packed rows), slot int64 [N,B], prefix state o_pre [R,Hq,D] f32,
    lse_pre [R,Hq] f32, or S split states [S,R,Hq,D] / [S,R,Hq] (``prefix_attention_states``)
    -> o [N,B,Hq,D] in q.dtype: each (n,b) attends with q[slot[n,b]] over k/v[slot[n,0..B-1]] and
    the result is merged with the prefix state(s) at slot[n,b]."""
    slot = _check_block_inputs(q, k, v, slot)
    R, Hq, D = q.shape
    if o_pre.dim() == 3:
        o_pre, lse_pre = o_pre.unsqueeze(0), lse_pre.unsqueeze(0)
    expect(o_pre.dim() == 4 and o_pre.shape[1:] == (R, Hq, D), "o_pre", f"[{R}, {Hq}, {D}] or [S, {R}, {Hq}, {D}]",
           tuple(o_pre.shape))
    expect(lse_pre.shape == o_pre.shape[:3], "lse_pre", f"{tuple(o_pre.shape)[:3]} (o_pre's leading dims)",
           tuple(lse_pre.shape))
    _check_last_contig(o_pre=o_pre)
    return _launch_block_kernel(q, k, v, slot, scale, states=(o_pre, lse_pre))


def one_pass_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot: torch.Tensor,
                       k_pre: torch.Tensor, v_pre: torch.Tensor, scale: float,
                       config: tuple[int, int, int, int] | None = None,
                       prefix_len: torch.Tensor | None = None) -> torch.Tensor:
    """As ``block_attention`` fed ``prefix_attention_states``, in one launch and without states: each
    (n,b) attends with q[slot[n,b]] over the shared prefix k_pre, v_pre [Hkv,P,D] and then over
    k/v[slot[n,0..B-1]] in one online softmax. A folded row walks the prefix again (its origin's query),
    so this pays only for short prefixes and few rows (``use_one_pass``). ``config``: (BLOCK_M, BLOCK_P,
    num_warps, num_stages) instead of ``_one_pass_config`` (the benchmark's sweep). ``prefix_len``
    (int32/int64 device tensor, one element): only prefix keys [0, min(prefix_len, P)) take part, the
    kernel loading the length (CUDA-graph replays over a fixed-capacity cache); None: all P."""
    slot = _check_block_inputs(q, k, v, slot)
    _check_prefix_inputs(q, k_pre, v_pre, kv_heads=k.shape[1])
    _check_prefix_len(prefix_len, q)
    if config is not None:
        _check_tile_config(config)
    return _launch_block_kernel(q, k, v, slot, scale, prefix=(k_pre, v_pre), config=config, prefix_len=prefix_len)


def slot_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot: torch.Tensor, k_pre: torch.Tensor,
                   v_pre: torch.Tensor, scale: float, count: torch.Tensor | None = None,
                   prefix_len: torch.Tensor | None = None, *, tuning: AttentionTuning) -> torch.Tensor:
    """Attention of every (n,b) with q[slot[n,b]] over the prefix and k/v[slot[n,0..B-1]], the rows
    below the device-side ``count`` (or all) being the ones any slot points at: one pass where
    ``use_one_pass`` says so (under ``tuning``) for the N * B rows of ``slot``, else the prefix states of those rows (split
    along the prefix) merged by the block kernel. ``prefix_len``: only prefix keys [0, min(prefix_len,
    P)) take part (as in ``prefix_attention_states``); the path is still chosen from the capacity P."""
    slot = _check_block_inputs(q, k, v, slot)  # checked once here: the launches below do not check again
    _check_prefix_inputs(q, k_pre, v_pre, kv_heads=k.shape[1])
    _check_prefix_len(prefix_len, q)
    _check_tuning(tuning)
    if use_one_pass(slot.numel(), q.shape[1], k_pre.shape[1], tuning):
        return _launch_block_kernel(q, k, v, slot, scale, prefix=(k_pre, v_pre), prefix_len=prefix_len)
    states = _launch_prefix_kernel(q, k_pre, v_pre, scale, count, prefix_len=prefix_len, tuning=tuning)
    return _launch_block_kernel(q, k, v, slot, scale, states=states)


def branch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pre: torch.Tensor,
                     v_pre: torch.Tensor, scale: float, prefix_len: torch.Tensor | None = None, *,
                     tuning: AttentionTuning) -> torch.Tensor:
    """Dense multi-branch attention: q [N,B,Hq,D], k,v [N,B,Hkv,D], shared prefix k_pre, v_pre
    [Hkv,P,D] (never copied). Each branch attends to the prefix (its first min(prefix_len, P) keys
    with a device-side ``prefix_len``, as in ``slot_attention``) and bidirectionally to its own
    block. Returns [N,B,Hq,D] in q.dtype."""
    N, B, Hq, D = q.shape
    Hkv = k.shape[2]
    qf = q.reshape(N * B, Hq, D)
    kf = k.reshape(N * B, Hkv, D)
    vf = v.reshape(N * B, Hkv, D)
    slot = torch.arange(N * B, device=q.device, dtype=torch.int64).view(N, B)
    return slot_attention(qf, kf, vf, slot, k_pre, v_pre, scale, prefix_len=prefix_len, tuning=tuning)
