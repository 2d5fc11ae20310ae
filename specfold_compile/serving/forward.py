"""The batched passes of the serving engine: one verification forward over the rows of several requests,
and one block write for several requests, each request reading its own slot of the ``KVPool``.

Both run the model's own modules (``BlockDiffusionLM``: ``embed_tokens``, each ``DecoderLayer``'s
``qkv`` / ``attn_out`` / ``mlp_out``, ``norm``, ``head``, ``position_tables``) and weights:

* every position-wise part (embedding, norms, q/k/v and output projections, RoPE, MLP, final norm) runs
  once over the rows of all requests concatenated, ``[R, B, C]`` with ``R`` the sum of the requests'
  branch counts; the LM head runs per request (below);
* attention, the only part that mixes positions, runs once per request on that request's rows against
  its own prefix (views of its pool slot), through the same op and the same shapes as the request's
  batch-1 forward (``ops.branch_attention`` for verification, ``scaled_dot_product_attention`` for
  block writes), so batching changes no request's numbers;
* RoPE tables are made per request (its block's positions) and concatenated along the rows.

A request's rows therefore get the logits of ``model(tokens, parents, cache)`` on that request alone, up
to the GEMMs' rounding where the row count changes the kernel the BLAS picks. On the CPU (float32) they
are bit for bit the batch-1 logits: the decoder layers' GEMMs have at least ``B`` rows, where the rows do
not change each other's rounding, and the LM head (whose row count, the request's masked positions, can
be 1-3, where the BLAS takes another path) runs per request. The tests check it on both families.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import ops
from ..models.layers import PositionTables
from .pool import KVPool

__all__ = ["verify_batch", "write_blocks", "check_serving_model", "attend_requests", "request_logits", "row_bounds"]


def check_serving_model(model) -> None:
    """The engine runs the package's ``BlockDiffusionLM`` modules one by one: anything else is refused."""
    from ..models import BlockDiffusionLM

    if not isinstance(model, BlockDiffusionLM):
        raise TypeError(f"model: the serving engine needs a specfold_compile BlockDiffusionLM (models.build, "
                        f"from_pretrained, from_hf), got {type(model).__name__}")


def _row_tables(model, starts: list[int], counts: list[int], block: int, device) -> PositionTables:
    """The RoPE tables of every row: request ``i``'s ``counts[i]`` rows sit at positions ``starts[i] +
    [0, block)``; each request's table is computed as its batch-1 forward computes it, then repeated
    over its rows. cos/sin ``[R, block, 1, D]``, q_scale ``[R, block, 1, 1]`` or None."""
    cos, sin, scale = [], [], []
    for start, count in zip(starts, counts):
        pos = model.position_tables(torch.arange(block, device=device) + start)
        cos.append(pos.cos.expand(count, *pos.cos.shape))
        sin.append(pos.sin.expand(count, *pos.sin.shape))
        if pos.q_scale is not None:
            scale.append(pos.q_scale.expand(count, *pos.q_scale.shape))
    return PositionTables(torch.cat(cos), torch.cat(sin), torch.cat(scale) if scale else None)


def verify_batch(model, pool: KVPool, slots: list[int], rows: list[Tensor],
                 logit_positions: list[Tensor]) -> list[Tensor]:
    """One verification forward for several requests.

    ``rows[i]``: request ``i``'s tokens int64 ``[N_i, B]`` (row 0 its main branch), verified against the
    prefix of pool slot ``slots[i]``; ``logit_positions[i]``: flat positions ``n * B + p`` of its rows
    whose logits are wanted (``model.forward``'s ``logit_positions``). Returns each request's logits
    ``[M_i, V]``, in the given order: the logits ``model(rows[i], parents, cache_i,
    logit_positions=logit_positions[i])`` gives on that request alone.
    """
    counts = [int(r.shape[0]) for r in rows]
    block = int(rows[0].shape[1])
    tokens = torch.cat(rows)
    device = tokens.device
    pos = _row_tables(model, [pool.lengths[s] for s in slots], counts, block, device)
    bounds = row_bounds(counts)
    h = model.embed_tokens(tokens)
    for index, layer in enumerate(model.layers):
        q, k, v = layer.qkv(h, pos)
        h = h + layer.attn_out(attend_requests(q, k, v, pool, slots, bounds, index, layer.scale))
        h = h + layer.mlp_out(h)
    return request_logits(model, h, bounds, logit_positions)


def row_bounds(counts: list[int]) -> list[int]:
    """Where each request's rows start in the concatenation, and where the last one ends."""
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    return bounds


def attend_requests(q: Tensor, k: Tensor, v: Tensor, pool: KVPool, slots: list[int], bounds: list[int],
                    layer: int, scale: float) -> Tensor:
    """Every request's rows attending to its own slot's prefix (of decoder layer ``layer``) and to their own
    blocks: q ``[R, B, Hq, D]``, k/v ``[R, B, Hkv, D]``, request ``i`` the rows ``bounds[i]:bounds[i + 1]``
    against slot ``slots[i]``. One ``ops.branch_attention`` per request, its batch-1 call."""
    outs = []
    for i, slot in enumerate(slots):
        a, b = bounds[i], bounds[i + 1]
        k_pre, v_pre = pool.prefix(slot, layer)
        outs.append(ops.branch_attention(q[a:b], k[a:b], v[a:b], k_pre, v_pre, scale, None))
    return torch.cat(outs)


def request_logits(model, h: Tensor, bounds: list[int], logit_positions: list[Tensor]) -> list[Tensor]:
    """Each request's logits at its ``logit_positions`` from the final hidden states ``h`` [R, B, C] (the
    family's shift included): the final norm over every request's rows at once, the LM head per request."""
    block = int(h.shape[1])
    flat = torch.cat([p.to(h.device) + bounds[i] * block for i, p in enumerate(logit_positions)])
    normed = model.norm(h.flatten(0, 1).index_select(0, model.logit_rows(flat, block)))
    # the LM head per request: its row count is the request's own (the BLAS rounds a GEMM of 1-3 rows
    # unlike a larger one), so each request's logits are its batch-1 logits bit for bit on the CPU
    return [model.head(part) for part in normed.split([int(p.numel()) for p in logit_positions])]


def write_blocks(model, pool: KVPool, slots: list[int], blocks: list[Tensor]) -> list[Tensor]:
    """Append one finished block (int64 ``[S]``) to each slot's prefix in one pass, as
    ``model.write_block`` appends it to a request's own cache (Fast-dLLM v2: the block attends
    bidirectionally to itself; NLD: causally). Returns each request's next-block logits ``[V]`` (its
    last position's), the ``next_logits`` of its batch-1 write."""
    causal = model.config.family == "nld"
    tokens = torch.stack(blocks)
    s, device = int(tokens.shape[1]), tokens.device
    lengths = [pool.lengths[slot] for slot in slots]
    for slot in slots:
        pool._check_room(slot, s, pool.lengths[slot])
    pos = _row_tables(model, lengths, [1] * len(slots), s, device)
    h = model.embed_tokens(tokens)
    for index, layer in enumerate(model.layers):
        q, k, v = layer.qkv(h, pos)  # [b, S, H, D]
        outs = []
        for i, slot in enumerate(slots):
            k_pre, v_pre = pool.prefix(slot, index)
            p = lengths[i]
            allowed = torch.ones(s, p + s, dtype=torch.bool, device=device)
            if causal:
                allowed[:, p:] = torch.ones(s, s, dtype=torch.bool, device=device).tril()
            k_all = torch.cat((k_pre.transpose(0, 1).unsqueeze(0), k[i:i + 1]), dim=1)
            v_all = torch.cat((v_pre.transpose(0, 1).unsqueeze(0), v[i:i + 1]), dim=1)
            o = F.scaled_dot_product_attention(
                q[i:i + 1].transpose(1, 2), k_all.transpose(1, 2), v_all.transpose(1, 2),
                attn_mask=allowed[None, None], scale=layer.scale, enable_gqa=True).transpose(1, 2)
            outs.append(o)
            pool.append(slot, index, k[i].transpose(0, 1), v[i].transpose(0, 1))
        h = h + layer.attn_out(torch.cat(outs))
        h = h + layer.mlp_out(h)
    for slot in slots:
        pool.advance(slot, s)
    last = model.norm(h[:, -1])
    return [model.head(last[i:i + 1])[0] for i in range(len(slots))]  # per request, as verify_batch
