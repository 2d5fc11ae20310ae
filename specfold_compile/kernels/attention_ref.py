"""Pure-torch oracle for folded attention (natural-log LSE, float32 states).

State over a key set: (o, lse) with o the normalised softmax average of the values and lse the
natural-log logsumexp of the scaled scores. Empty state: (0, -inf).

``prefix_len`` (a one-element integer tensor): only the first min(prefix_len, P) prefix keys take part,
as in the kernels (a fixed-capacity cache under CUDA-graph replays). The references mask the scores of
the other keys to -inf rather than slicing, so they never read the length on the host either.
"""
from __future__ import annotations

import torch


def merge_states(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor):
    """Merge two attention states. o*: [..., D] float32, lse*: [...] float32.

    m = max(lse1, lse2); if m == -inf the result is the empty state (0, -inf) with no NaN;
    weights are computed before the outputs are scaled.
    """
    lse1 = lse1.float()
    lse2 = lse2.float()
    m = torch.maximum(lse1, lse2)
    empty = m == float("-inf")
    m_safe = torch.where(empty, torch.zeros_like(m), m)
    w1 = torch.exp(lse1 - m_safe)
    w2 = torch.exp(lse2 - m_safe)
    den = w1 + w2
    ok = den > 0
    inv = torch.where(ok, 1.0 / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(den))
    a1 = (w1 * inv).unsqueeze(-1)
    a2 = (w2 * inv).unsqueeze(-1)
    # a zero weight must not let a garbage output through (0 * NaN)
    t1 = torch.where(a1 > 0, a1 * o1.float(), torch.zeros_like(o1, dtype=torch.float32))
    t2 = torch.where(a2 > 0, a2 * o2.float(), torch.zeros_like(o2, dtype=torch.float32))
    o = t1 + t2
    lse = torch.where(ok, m_safe + torch.log(torch.where(ok, den, torch.ones_like(den))),
                      torch.full_like(m, float("-inf")))
    return o, lse


def merge_split_states(o: torch.Tensor, lse: torch.Tensor):
    """Merge S states stacked on dim 0 (o [S, ..., D], lse [S, ...]) into one, in order."""
    o_m, lse_m = o[0].float(), lse[0].float()
    for i in range(1, o.shape[0]):
        o_m, lse_m = merge_states(o_m, lse_m, o[i], lse[i])
    return o_m, lse_m


def _group(hq: int, hkv: int) -> int:
    assert hq % hkv == 0, "Hq must be a multiple of Hkv"
    return hq // hkv


def _mask_prefix_scores(s: torch.Tensor, prefix_len) -> torch.Tensor:
    """Scores s [..., P] over the prefix keys with the keys at positions >= prefix_len set to -inf (a
    device-side comparison: no host read)."""
    if prefix_len is None:
        return s
    valid = torch.arange(s.shape[-1], device=s.device) < prefix_len.reshape(())
    return s.masked_fill(~valid, float("-inf"))


def prefix_attention_ref(q, k_pre, v_pre, scale, count=None, prefix_len=None):
    """q [R,Hq,D]; k_pre, v_pre [Hkv,P,D] -> (o [R,Hq,D] f32, lse [R,Hq] f32). `count` is ignored
    (rows >= count are unspecified in the kernel; the oracle computes them all). ``prefix_len``: only
    keys [0, min(prefix_len, P)) take part (masked); none of them gives the empty state (0, -inf)."""
    R, Hq, D = q.shape
    Hkv, P, _ = k_pre.shape
    g = _group(Hq, Hkv)
    if P == 0:
        return (torch.zeros(R, Hq, D, dtype=torch.float32, device=q.device),
                torch.full((R, Hq), float("-inf"), dtype=torch.float32, device=q.device))
    qf = q.float().view(R, Hkv, g, D)
    s = _mask_prefix_scores(torch.einsum("rkgd,kpd->rkgp", qf, k_pre.float()) * float(scale), prefix_len)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    if prefix_len is not None:  # all keys masked: softmax is NaN there, the state must be empty
        p = torch.where((lse > float("-inf")).unsqueeze(-1), p, torch.zeros_like(p))
    o = torch.einsum("rkgp,kpd->rkgd", p, v_pre.float())
    return o.reshape(R, Hq, D), lse.reshape(R, Hq)


def block_attention_ref(q, k, v, slot, o_pre, lse_pre, scale):
    """q [R,Hq,D], k,v [R,Hkv,D] packed rows; slot [N,B]; o_pre [R,Hq,D], lse_pre [R,Hq] (or S split
    states [S,R,Hq,D], [S,R,Hq], merged first) -> o [N,B,Hq,D] in q.dtype: each (n,b) attends with
    q[slot[n,b]] over its branch's block k/v[slot[n, :]], merged with the prefix state at slot[n,b]."""
    if o_pre.dim() == 4:
        o_pre, lse_pre = merge_split_states(o_pre, lse_pre)
    R, Hq, D = q.shape
    Hkv = k.shape[1]
    g = _group(Hq, Hkv)
    N, B = slot.shape
    sl = slot.long()
    qb = q.float()[sl].view(N, B, Hkv, g, D)            # [N,B,Hkv,g,D]
    kb = k.float()[sl]                                  # [N,B,Hkv,D]
    vb = v.float()[sl]
    s = torch.einsum("nbkgd,njkd->nbkgj", qb, kb) * float(scale)
    lse_blk = torch.logsumexp(s, dim=-1)
    o_blk = torch.einsum("nbkgj,njkd->nbkgd", torch.softmax(s, dim=-1), vb)
    o_blk = o_blk.reshape(N, B, Hq, D)
    lse_blk = lse_blk.reshape(N, B, Hq)
    o, _ = merge_states(o_pre.float()[sl], lse_pre.float()[sl], o_blk, lse_blk)
    return o.to(q.dtype)


def branch_attention_ref(q, k, v, k_pre, v_pre, scale, prefix_len=None):
    """Dense multi-branch attention, computed directly (not through merging): q [N,B,Hq,D],
    k,v [N,B,Hkv,D], k_pre,v_pre [Hkv,P,D]; every branch attends to the shared prefix (its keys
    [0, min(prefix_len, P)) with a ``prefix_len``, masked) and, bidirectionally, to its own block.
    Returns [N,B,Hq,D] in q.dtype. The prefix is broadcast inside einsum, never copied per branch.
    An all-masked prefix needs no care: the block's keys are always there."""
    N, B, Hq, D = q.shape
    Hkv = k.shape[2]
    g = _group(Hq, Hkv)
    qf = q.float().view(N, B, Hkv, g, D)
    s_blk = torch.einsum("nbkgd,njkd->nbkgj", qf, k.float()) * float(scale)
    s_pre = _mask_prefix_scores(torch.einsum("nbkgd,kpd->nbkgp", qf, k_pre.float()) * float(scale), prefix_len)
    s = torch.cat([s_pre, s_blk], dim=-1)
    p = torch.softmax(s, dim=-1)
    P = k_pre.shape[1]
    o = torch.einsum("nbkgp,kpd->nbkgd", p[..., :P], v_pre.float()) + \
        torch.einsum("nbkgj,njkd->nbkgd", p[..., P:], v.float())
    return o.reshape(N, B, Hq, D).to(q.dtype)
