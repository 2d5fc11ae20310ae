"""The batched passes of the serving engine: one verification forward over the rows of several requests,
and one block write for several requests, each request reading its own slot of the ``KVPool``.

Both run the model's own modules (``BlockDiffusionLM``: ``embed_tokens``, each ``DecoderLayer``'s
``qkv`` / ``attn_out`` / ``mlp_out``, ``norm``, ``head``, ``position_tables``) and weights:

* every position-wise part (embedding, norms, q/k/v and output projections, RoPE, MLP, final norm) runs
  once over the rows of all requests concatenated, ``[R, B, C]`` with ``R`` the sum of the requests'
  branch counts; the LM head runs per request (below);
* attention, the only part that mixes positions, runs in one of two ways (``attention=``):

  - ``"per_request"`` (the default): once per request on that request's rows against its own prefix
    (views of its pool slot), through the same op and the same shapes as the request's batch-1 forward
    (``ops.branch_attention`` for verification, ``scaled_dot_product_attention`` for block writes), so
    batching changes no request's numbers;
  - ``"ragged"``: one ``ops.ragged_attention`` call a layer over the rows of every request, each
    request's rows reading its own slot's prefix in place (slots, lengths and row bounds as device
    tensors, made once per pass): the same attention up to float rounding (the kernel sums in another
    order), in one launch (two where the kernel splits a long prefix) instead of one per request;

* RoPE tables are made per request (its block's positions) and concatenated along the rows.

A request's rows therefore get the logits of ``model(tokens, parents, cache)`` on that request alone, up
to the GEMMs' rounding where the row count changes the kernel the BLAS picks. On the CPU (float32) and
with ``"per_request"`` they are bit for bit the batch-1 logits: the decoder layers' GEMMs have at least
``B`` rows, where the rows do not change each other's rounding, and the LM head (whose row count, the
request's masked positions, can be 1-3, where the BLAS takes another path) runs per request. The tests
check it on both families, and that ``"ragged"`` gives the same to float32 tolerance.

``attend_requests`` is one layer's verification attention by either path, for any batched forward that
lays its rows out the same way (``RequestRows``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import ops
from ..models.layers import PositionTables
from .pool import KVPool

__all__ = ["verify_batch", "write_blocks", "check_serving_model", "attend_requests", "request_rows", "RequestRows",
           "ATTENTION_PATHS", "check_attention", "engine_attention", "request_logits", "row_bounds"]

ATTENTION_PATHS = ("per_request", "ragged")


def check_serving_model(model) -> None:
    """The engine runs the package's ``BlockDiffusionLM`` modules one by one: anything else is refused."""
    from ..models import BlockDiffusionLM

    if not isinstance(model, BlockDiffusionLM):
        raise TypeError(f"model: the serving engine needs a specfold_compile BlockDiffusionLM (models.build, "
                        f"from_pretrained, from_hf), got {type(model).__name__}")


def engine_attention(attention, device: torch.device) -> str:
    """The ``Engine``'s path: ``attention`` checked, ``"auto"`` resolved by the device alone (never by the
    batch): ``"ragged"`` on CUDA, where one launch a layer serves every request (docs/benchmarks.md
    measures it against ``"per_request"``), ``"per_request"`` elsewhere, where it is the batch-1 forward
    bit for bit."""
    if attention == "auto":
        return "ragged" if torch.device(device).type == "cuda" else "per_request"
    if not isinstance(attention, str) or attention not in ATTENTION_PATHS:
        raise ValueError(f"attention: expected 'auto' or one of {ATTENTION_PATHS}, got {attention!r}")
    return attention


def check_attention(attention) -> str:
    """``attention``: one of ``ATTENTION_PATHS`` (a one-line error naming the argument otherwise)."""
    if not isinstance(attention, str) or attention not in ATTENTION_PATHS:
        raise ValueError(f"attention: expected one of {ATTENTION_PATHS}, got {attention!r}")
    return attention


@dataclass(frozen=True)
class RequestRows:
    """Whose rows a batched pass holds: request ``i`` owns rows ``[bounds[i], bounds[i + 1])`` of the
    concatenated ``[R, B, ...]`` tensors and reads pool slot ``slots[i]`` (host lists). With the ragged
    path, the same as device tensors for the kernel to load, made once for all layers: ``device_bounds``
    ``[n + 1]``, ``device_slots`` ``[n]``, ``device_lengths`` ``[n]`` (the slots' prefix lengths when the
    pass began); None otherwise."""

    slots: list[int]
    bounds: list[int]
    device_bounds: Tensor | None = None
    device_slots: Tensor | None = None
    device_lengths: Tensor | None = None


def request_rows(pool: KVPool, slots: list[int], counts: list[int], attention: str = "per_request") -> RequestRows:
    """The ``RequestRows`` of requests in ``slots`` owning ``counts`` consecutive rows each (``attention``:
    the path the pass takes; ``"ragged"`` makes the device tensors)."""
    bounds = row_bounds(counts)
    if check_attention(attention) == "per_request":
        return RequestRows(list(slots), bounds)
    dev = pool.device
    return RequestRows(list(slots), bounds, torch.tensor(bounds, dtype=torch.int32, device=dev),
                       torch.tensor(slots, dtype=torch.int32, device=dev), pool.device_lengths(slots))


def attend_requests(q: Tensor, k: Tensor, v: Tensor, pool: KVPool, layer: int, rows: RequestRows, scale: float,
                    attention: str = "per_request") -> Tensor:
    """One layer's verification attention over the rows of several requests: q ``[R, B, Hq, D]``, k, v
    ``[R, B, Hkv, D]`` laid out as ``rows`` says; every row attends to its request's prefix (layer
    ``layer`` of its pool slot) and, bidirectionally, to its own block. ``"per_request"``:
    ``ops.branch_attention`` per request on views of its slot; ``"ragged"``: one ``ops.ragged_attention``
    over all rows (``rows`` made with ``attention="ragged"``). Returns ``[R, B, Hq, D]``."""
    if check_attention(attention) == "ragged":
        if rows.device_lengths is None:
            raise ValueError("rows: attention='ragged' needs the device tensors of request_rows(..., "
                             "attention='ragged')")
        return ops.ragged_attention(q, k, v, pool.keys[layer], pool.values[layer], rows.device_bounds,
                                    rows.device_slots, rows.device_lengths, scale)
    outs = []
    for i, slot in enumerate(rows.slots):
        a, b = rows.bounds[i], rows.bounds[i + 1]
        k_pre, v_pre = pool.prefix(slot, layer)
        outs.append(ops.branch_attention(q[a:b], k[a:b], v[a:b], k_pre, v_pre, scale, None))
    return torch.cat(outs)


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
                 logit_positions: list[Tensor], attention: str = "per_request") -> list[Tensor]:
    """One verification forward for several requests.

    ``rows[i]``: request ``i``'s tokens int64 ``[N_i, B]`` (row 0 its main branch), verified against the
    prefix of pool slot ``slots[i]``; ``logit_positions[i]``: flat positions ``n * B + p`` of its rows
    whose logits are wanted (``model.forward``'s ``logit_positions``). Returns each request's logits
    ``[M_i, V]``, in the given order: the logits ``model(rows[i], parents, cache_i,
    logit_positions=logit_positions[i])`` gives on that request alone. ``attention``: ``"per_request"``
    or ``"ragged"`` (module docstring).
    """
    check_attention(attention)
    counts = [int(r.shape[0]) for r in rows]
    block = int(rows[0].shape[1])
    tokens = torch.cat(rows)
    device = tokens.device
    pos = _row_tables(model, [pool.lengths[s] for s in slots], counts, block, device)
    owners = request_rows(pool, slots, counts, attention)
    bounds = owners.bounds
    h = model.embed_tokens(tokens)
    for index, layer in enumerate(model.layers):
        q, k, v = layer.qkv(h, pos)
        o = attend_requests(q, k, v, pool, index, owners, layer.scale, attention)
        h = h + layer.attn_out(o)
        h = h + layer.mlp_out(h)
    return request_logits(model, h, bounds, logit_positions)


def row_bounds(counts: list[int]) -> list[int]:
    """Where each request's rows start in the concatenation, and where the last one ends."""
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    return bounds


def request_logits(model, h: Tensor, bounds: list[int], logit_positions: list[Tensor]) -> list[Tensor]:
    """Each request's logits at its ``logit_positions`` from the final hidden states ``h`` [R, B, C] (the
    family's shift included): the final norm over every request's rows at once, the LM head per request."""
    block = int(h.shape[1])
    flat = torch.cat([p.to(h.device) + bounds[i] * block for i, p in enumerate(logit_positions)])
    normed = model.norm(h.flatten(0, 1).index_select(0, model.logit_rows(flat, block)))
    # the LM head per request: its row count is the request's own (the BLAS rounds a GEMM of 1-3 rows
    # unlike a larger one), so each request's logits are its batch-1 logits bit for bit on the CPU
    return [model.head(part) for part in normed.split([int(p.numel()) for p in logit_positions])]


def _write_attention(q: Tensor, k: Tensor, v: Tensor, k_pre: Tensor, v_pre: Tensor, scale: float,
                     causal: bool) -> Tensor:
    """One request's block write attention, as its batch-1 ``write_block`` computes it: q ``[1, S, Hq, D]``,
    k, v ``[1, S, Hkv, D]`` over the prefix ``[Hkv, P, D]`` and the block itself (causally with
    ``causal``), through ``scaled_dot_product_attention``."""
    s, p = q.shape[1], k_pre.shape[1]
    allowed = torch.ones(s, p + s, dtype=torch.bool, device=q.device)
    if causal:
        allowed[:, p:] = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    k_all = torch.cat((k_pre.transpose(0, 1).unsqueeze(0), k), dim=1)
    v_all = torch.cat((v_pre.transpose(0, 1).unsqueeze(0), v), dim=1)
    return F.scaled_dot_product_attention(q.transpose(1, 2), k_all.transpose(1, 2), v_all.transpose(1, 2),
                                          attn_mask=allowed[None, None], scale=scale,
                                          enable_gqa=True).transpose(1, 2)


def write_blocks(model, pool: KVPool, slots: list[int], blocks: list[Tensor],
                 attention: str = "per_request") -> list[Tensor]:
    """Append one finished block (int64 ``[S]``) to each slot's prefix in one pass, as
    ``model.write_block`` appends it to a request's own cache (Fast-dLLM v2: the block attends
    bidirectionally to itself; NLD: causally). Returns each request's next-block logits ``[V]`` (its
    last position's), the ``next_logits`` of its batch-1 write. ``attention``: ``"per_request"`` or
    ``"ragged"`` (module docstring; ragged: each block is one row of ``S`` positions)."""
    check_attention(attention)
    causal = model.config.family == "nld"
    tokens = torch.stack(blocks)
    s, device = int(tokens.shape[1]), tokens.device
    lengths = [pool.lengths[slot] for slot in slots]
    for slot in slots:
        pool._check_room(slot, s, pool.lengths[slot])
    pos = _row_tables(model, lengths, [1] * len(slots), s, device)
    owners = request_rows(pool, slots, [1] * len(slots), attention)
    h = model.embed_tokens(tokens)
    for index, layer in enumerate(model.layers):
        q, k, v = layer.qkv(h, pos)  # [b, S, H, D]
        if attention == "ragged":
            o = ops.ragged_attention(q, k, v, pool.keys[index], pool.values[index], owners.device_bounds,
                                     owners.device_slots, owners.device_lengths, layer.scale, causal)
        else:
            o = torch.cat([_write_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], *pool.prefix(slot, index),
                                            layer.scale, causal) for i, slot in enumerate(slots)])
        for i, slot in enumerate(slots):  # past every slot's length: no request's attention above read it
            pool.append(slot, index, k[i].transpose(0, 1), v[i].transpose(0, 1))
        h = h + layer.attn_out(o)
        h = h + layer.mlp_out(h)
    for slot in slots:
        pool.advance(slot, s)
    last = model.norm(h[:, -1])
    return [model.head(last[i:i + 1])[0] for i in range(len(slots))]  # per request, as verify_batch
