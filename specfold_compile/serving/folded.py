"""SpecFold's verification forward over several requests at once (the engine's ``mode="specfold"``).

``verify_batch_folded`` is the folded forward of docs/SPEC.md section 2 (``reference.folded_verify``'s
math: ``reference.FoldGates``, ``reference.folded_layers``) run over the rows of every request
concatenated, ``[R, B, C]``:

* each layer's gate and packing run once over all the rows: every draft row folds against its own parent
  row within its own request (the parents are offset to the concatenation; a request's main row has
  none, so it never folds), and the computed rows of every request are packed into one batch for the
  position-wise parts (norms, q/k/v projections, RoPE, MLP), then scattered back through the origin map;
* attention runs per request against its own pool slot (``forward.attend_requests``), every row with its
  (possibly inherited) query over the slot's prefix and its own branch's block (with
  ``packed_attention``, one ``ops.folded_ragged_attention`` a layer over the packed rows: each computed
  position's prefix walked once, a folded position's prefix state being its origin's);
* the final norm runs over every request's wanted rows at once, the LM head per request
  (``forward.request_logits``).

A request's gates see only its own rows (the gate compares a row with its parent, both in the request),
so its fold masks, and given them its logits, are those of ``reference.folded_verify`` on that request
alone: bit for bit on the CPU in float32 (the packed GEMMs have at least ``B`` rows, each request's main
row being always computed), tested. Given the same masks (SPEC P4) they are the logits of the request's
batch-1 SpecFold forward, up to the rounding of the compiled kernels.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ..models.checks import validate_parents
from ..models.layers import PositionTables
from ..reference import FoldGates, chain_depth, check_gate, folded_layers, gate_count
from .compiled import check_packed_attention, folded_pieces
from .forward import _row_tables, attend_requests, request_logits, request_rows
from .pool import KVPool

__all__ = ["verify_batch_folded"]


def _check_lists(slots, rows, parents, logit_positions, fold_masks) -> None:
    named = {"rows": rows, "parents": parents, "logit_positions": logit_positions}
    if fold_masks is not None:
        named["fold_masks"] = fold_masks
    for name, value in named.items():
        if not isinstance(value, (list, tuple)) or len(value) != len(slots):
            raise ValueError(f"{name}: expected a list of {len(slots)} (one per slot), got "
                             f"{type(value).__name__} of {len(value) if hasattr(value, '__len__') else '?'}")
    if not slots:
        raise ValueError("slots: expected at least one request")


def _offset_parents(parents: list, counts: list[int], bounds: list[int], device) -> tuple[Tensor, int]:
    """Every request's parents checked (``parents[i]``: int64 [N_i], -1 then rows in topological order) and
    moved to the rows' concatenation (a main row keeps -1: no parent, it never folds), with their
    ``chain_depth`` (the longest fold chain lies within one request)."""
    out, depth = [], 0
    for i, (p, n) in enumerate(zip(parents, counts)):
        p = torch.as_tensor(p, dtype=torch.long).cpu()
        if p.shape != (n,):
            raise ValueError(f"parents[{i}]: expected int64 [{n}] (one per row of rows[{i}]), got shape "
                             f"{tuple(p.shape)}")
        try:
            validate_parents(p)
        except ValueError as exc:
            raise ValueError(f"parents[{i}]: {str(exc).removeprefix('parents: ')}") from None
        out.append(torch.where(p >= 0, p + bounds[i], p))
        depth = max(depth, chain_depth(p.tolist()))
    return torch.cat(out).to(device), depth


def _forced_masks(fold_masks: list, counts: list[int], gates: int, block: int, device) -> list[Tensor]:
    """Per-request forced masks (bool [G, N_i, B] each) as the G masks [R, B] of the concatenation."""
    out = []
    for i, (m, n) in enumerate(zip(fold_masks, counts)):
        m = torch.stack(list(m)) if isinstance(m, (list, tuple)) else m
        if not isinstance(m, Tensor) or m.dtype != torch.bool or tuple(m.shape) != (gates, n, block):
            raise ValueError(f"fold_masks[{i}]: expected a bool tensor [{gates}, {n}, {block}] (one [N, B] mask a "
                             f"gate), got {getattr(m, 'dtype', type(m).__name__)} "
                             f"{tuple(getattr(m, 'shape', ()))}")
        out.append(m.to(device))
    main_folds = torch.stack([m[:, 0].any() for m in out])  # one host read for every request
    if bool(main_folds.any()):
        raise ValueError(f"fold_masks[{int(main_folds.nonzero()[0])}]: row 0 (the request's main branch) never "
                         f"folds")
    return list(torch.cat(out, dim=1))


@torch.no_grad()
def verify_batch_folded(model, pool: KVPool, slots: list[int], rows: list[Tensor], parents: list,
                        logit_positions: list[Tensor], tau: float, fold_masks: list | None = None,
                        gate: str = "layer", attention: str = "per_request",
                        packed_attention: bool = False) -> tuple[list[Tensor], list[Tensor]]:
    """One folded verification forward for several requests (module docstring).

    ``rows[i]``: request ``i``'s tokens int64 ``[N_i, B]`` (row 0 its main branch), verified against the
    prefix of pool slot ``slots[i]``; ``parents[i]``: its rows' parents (int64 ``[N_i]``, ``-1`` first,
    then each row's parent among its earlier rows); ``logit_positions[i]``: the flat positions ``n * B +
    p`` of its rows whose logits are wanted; ``tau``: the fold threshold (``>= 0``; 0 folds nothing);
    ``gate``: ``"layer"`` (one gate a decoder layer) or ``"sublayer"`` (the MLP re-gated at ``h_mid``).
    ``fold_masks[i]`` (optional, bool ``[G, N_i, B]``, G the gates): request ``i``'s folds forced instead
    of gated (SPEC P4). ``attention``: ``"per_request"`` or ``"ragged"``, as in ``forward.verify_batch``;
    ``packed_attention`` (with ``"ragged"``): the attention reads the packed rows' q, k, v
    (``ops.folded_ragged_attention``: each computed position's prefix walked once) instead of every
    position's.

    Returns ``(logits, masks)``: each request's logits ``[M_i, V]`` at its ``logit_positions``, and each
    request's fold masks, bool ``[G, N_i, B]`` (gate ``g``'s mask of its rows), in the given order.
    """
    _check_lists(slots, rows, parents, logit_positions, fold_masks)
    check_gate(gate)
    check_packed_attention(packed_attention, attention)
    counts = [int(r.shape[0]) for r in rows]
    block = int(rows[0].shape[1])
    tokens = torch.cat(rows)
    device = tokens.device
    owners = request_rows(pool, slots, counts, attention)
    bounds = owners.bounds
    n_gates = gate_count(len(model.layers), gate)
    forced = None if fold_masks is None else _forced_masks(fold_masks, counts, n_gates, block, device)
    offset, depth = _offset_parents(parents, counts, bounds, device)
    gates = FoldGates(offset, tau, forced, depth=depth)

    pos = _row_tables(model, [pool.lengths[s] for s in slots], counts, block, device)  # [R, B, ...]
    flat = PositionTables(pos.cos.flatten(0, 1), pos.sin.flatten(0, 1),
                          None if pos.q_scale is None else pos.q_scale.flatten(0, 1))  # per flat row n * B + b

    def attend(index, layer, q, k, v, packed_rows, slot):
        if packed_attention:
            return ops.folded_ragged_attention(q, k, v, packed_rows, slot, pool.keys[index], pool.values[index],
                                               owners.device_bounds, owners.device_slots, owners.device_lengths,
                                               layer.scale)
        return attend_requests(q, k, v, pool, index, owners, layer.scale, attention)

    layers, pieces = folded_pieces(model, packed_attention)
    h = folded_layers(layers, model.embed_tokens(tokens), gates, flat, attend, gate, pieces)
    logits = request_logits(model, h, bounds, logit_positions)
    return logits, list(torch.stack(gates.masks).split(counts, dim=1))
