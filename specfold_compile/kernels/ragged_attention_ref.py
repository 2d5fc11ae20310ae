"""Pure-torch oracle of ragged-prefix branch attention (``ragged_attention.py``): each request's rows of
the concatenated ``q [R, B, Hq, D]`` attend to the first ``lengths[i]`` keys of pool slot ``slots[i]``
and to their own block (bidirectionally, or causally with ``causal``), in one softmax, computed directly
in float32.

The oracle walks the requests on the host, so it reads ``bounds`` back (the kernel never does); slots
and lengths are used on the device (an index_select and a masked comparison).
"""
from __future__ import annotations

import torch

from .attention_ref import _group, _mask_prefix_scores


def ragged_attention_ref(q, k, v, k_pool, v_pool, bounds, slots, lengths, scale, causal=False):
    """q [R, B, Hq, D], k, v [R, B, Hkv, D]; k_pool, v_pool [S, Hkv, C, D]; bounds [n + 1], slots [n],
    lengths [n] (integer tensors) -> [R, B, Hq, D] in q.dtype (``ragged_attention``'s contract)."""
    R, B, Hq, D = q.shape
    Hkv = k.shape[2]
    g = _group(Hq, Hkv)
    out = torch.zeros_like(q)
    edges = [int(e) for e in bounds.tolist()]
    block_ok = torch.ones(B, B, dtype=torch.bool, device=q.device)
    if causal:
        block_ok = block_ok.tril()  # [b, j]: key j for position b >= j
    for i in range(len(edges) - 1):
        a, e = edges[i], edges[i + 1]
        if a == e:
            continue
        k_pre = k_pool.index_select(0, slots[i:i + 1].long())[0].float()  # [Hkv, C, D]
        v_pre = v_pool.index_select(0, slots[i:i + 1].long())[0].float()
        qf = q[a:e].float().view(e - a, B, Hkv, g, D)
        s_pre = _mask_prefix_scores(torch.einsum("nbkgd,kpd->nbkgp", qf, k_pre) * float(scale), lengths[i])
        s_blk = torch.einsum("nbkgd,njkd->nbkgj", qf, k[a:e].float()) * float(scale)
        s_blk = s_blk.masked_fill(~block_ok[None, :, None, None, :], float("-inf"))
        p = torch.softmax(torch.cat([s_pre, s_blk], dim=-1), dim=-1)
        C = k_pre.shape[1]
        o = torch.einsum("nbkgp,kpd->nbkgd", p[..., :C], v_pre) + \
            torch.einsum("nbkgj,njkd->nbkgd", p[..., C:], v[a:e].float())
        out[a:e] = o.reshape(e - a, B, Hq, D).to(q.dtype)
    return out
