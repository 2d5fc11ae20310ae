"""The folded verification forward of SPEC.md section 2, in plain PyTorch.

This is the oracle for the compiler passes and the kernels: a loop over layers with the gate, the
origin map and the packing written out. Clarity beats speed here.

The pieces are shared with the serving engine's batched folded verification
(``serving.folded.verify_batch_folded``), which runs them over the rows of several requests at once:
``FoldGates`` (gate -> origin -> packing, one call per gate), ``folded_layers`` (the decoder layers over
the packed rows, attention through a callable, the position-wise parts through ``FOLDED_PIECES``, or
``PACKED_ATTENTION_PIECES`` where the attention reads the packed rows itself) and ``packed_tables`` (the
RoPE tables of the packed rows).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from .kernels.attention_ref import branch_attention_ref
from .kernels.gate_ref import FoldChains, chain_depth, fold_test, safe_parents
from .models.transformer import BlockDiffusionLM, PositionTables, PrefixCache

__all__ = ["folded_verify", "check_tau", "gate_count", "FoldGates", "folded_layers", "packed_tables", "GATES",
           "chain_depth", "FoldChains", "fold_test", "packed_qkv", "attn_residual", "packed_mlp", "FOLDED_PIECES",
           "packed_qkv_rows", "PACKED_ATTENTION_PIECES", "safe_parents"]

GATES = ("layer", "sublayer")

# attend(layer_index, layer, q, k, v, rows, slot) -> o [N, B, Hq, D]: every position's attention, from the q, k,
# v that the folded layer's qkv piece gives (every position's, [N, B, H, D], with ``FOLDED_PIECES``; the packed
# rows', [P, H, D], with ``PACKED_ATTENTION_PIECES``), the computed rows (flat n * B + b) and each position's
# origin slot among them [N, B]; an attention over every position's q, k, v needs neither
Attend = Callable[[int, torch.nn.Module, Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def check_tau(tau: float | Tensor) -> Tensor:
    value = float(tau)
    if math.isnan(value) or value < 0:
        raise ValueError(f"tau: expected a number >= 0, got {value}")
    return torch.tensor(value, dtype=torch.float32)


def check_gate(gate: str) -> None:
    if gate not in GATES:
        raise ValueError(f"gate: expected one of {GATES}, got {gate!r}")


def gate_count(num_layers: int, gate: str = "layer", fold_head: bool = False) -> int:
    """The gates one folded forward evaluates: one per layer (two with ``gate="sublayer"``), one more for
    the head with ``fold_head``."""
    return (2 if gate == "sublayer" else 1) * num_layers + int(fold_head)


def _check_forced(fold_masks: list[Tensor], rows: int) -> list[Tensor]:
    """The forced masks checked once for the whole forward (one host read, not one a gate)."""
    masks = list(fold_masks)
    for m in masks:
        if not isinstance(m, Tensor) or m.dtype != torch.bool or m.dim() != 2 or m.shape != masks[0].shape \
                or m.shape[0] != rows:
            raise ValueError(f"fold_masks: expected bool masks of one shape [{rows}, B], got "
                             f"{getattr(m, 'dtype', type(m).__name__)} {tuple(getattr(m, 'shape', ()))}")
    if masks and bool(torch.stack([m[0] for m in masks]).any()):
        raise ValueError("fold_masks: row 0 (the main branch) never folds")
    return masks


class FoldGates:
    """The gates of one folded forward over rows with ``parents`` [N] (a row whose parent lies outside
    ``[0, n)``, such as a main branch's ``-1``, never folds). Each call ``gates(h)`` on a residual stream
    ``h`` [N, B, C] evaluates the next gate (or takes the next of the forced ``fold_masks``, SPEC P4),
    keeps its mask in ``masks`` and returns the packing (SPEC section 2, steps 1-2): the computed rows
    (flat ``n * B + b``, in order) and each position's origin slot among them, [N, B]. The gate and the
    origins are tensor ops (``gate_ref.FoldChains``, made at the first gate and shared by the others);
    the one host read a gate is the computed rows' count, which sizes the packed batch. ``depth``: the
    parents' ``chain_depth`` when the caller has them on the host (fewer rounds of pointer jumping)."""

    def __init__(self, parents: Tensor, tau: float | Tensor, fold_masks: list[Tensor] | None = None,
                 depth: int | None = None):
        self.parents, self.tau, self.depth = parents, check_tau(tau), depth
        forced = None if fold_masks is None else _check_forced(fold_masks, int(parents.shape[0]))
        self._forced = iter(forced) if forced is not None else None
        self._chains: FoldChains | None = None
        self.masks: list[Tensor] = []

    def _fold(self, h: Tensor) -> Tensor:
        if self._chains is None:
            self._chains = FoldChains(self.parents.to(h.device), h.shape[1], self.depth)
        if self._forced is None:
            return self._chains.flags(h, self.tau.to(h.device))
        forced = next(self._forced)
        if forced.shape != h.shape[:2]:
            raise ValueError(f"fold_masks: expected bool masks of shape {tuple(h.shape[:2])}, got "
                             f"{forced.dtype} {tuple(forced.shape)}")
        return forced.to(h.device)

    def __call__(self, h: Tensor) -> tuple[Tensor, Tensor]:
        fold = self._fold(h)
        self.masks.append(fold)
        return self._chains.pack(fold)


def packed_tables(pos: PositionTables, index: Tensor) -> PositionTables:
    """The position tables of the packed rows: ``pos``'s entries ``index`` (one per packed row)."""
    return PositionTables(pos.cos[index], pos.sin[index], None if pos.q_scale is None else pos.q_scale[index])


def packed_qkv(layer, h: Tensor, rows: Tensor, slot: Tensor, tables: PositionTables):
    """The attention sublayer's position-wise part on the computed rows only (``rows``, flat ``n * B + b``
    indices into ``h`` [N, B, C] and ``tables``, one entry a flat position), every position taking its
    origin's q, k, v (``slot``, [N, B]): q [N, B, Hq, D], k, v [N, B, Hkv, D]."""
    q_p, k_p, v_p = packed_qkv_rows(layer, h, rows, slot, tables)  # [P, H, D]
    return q_p[slot], k_p[slot], v_p[slot]


def packed_qkv_rows(layer, h: Tensor, rows: Tensor, slot: Tensor, tables: PositionTables):
    """``packed_qkv`` left packed, for an attention that reads each position's origin through ``slot``
    itself: the computed rows' q [P, Hq, D], k, v [P, Hkv, D] (``slot`` unused)."""
    return layer.qkv(h.reshape(-1, h.shape[-1])[rows], packed_tables(tables, rows))


def attn_residual(layer, h: Tensor, o: Tensor) -> Tensor:
    """The attention sublayer's output projection on every row (each row's own attention), added to its
    residual stream."""
    return h + layer.attn_out(o)


def packed_mlp(layer, h_mid: Tensor, rows: Tensor, slot: Tensor) -> Tensor:
    """The MLP sublayer on the computed rows only, every position adding its origin's output to its own
    residual stream."""
    return h_mid + layer.mlp_out(h_mid.reshape(-1, h_mid.shape[-1])[rows])[slot]


# The folded layer's three position-wise pieces: (packed_qkv, attn_residual, packed_mlp). The serving
# engine passes them compiled (``serving.compiled``), each a graph with its gathers fused.
FOLDED_PIECES = (packed_qkv, attn_residual, packed_mlp)
# The same with q, k, v left packed, for an attention over the packed rows (ops.folded_ragged_attention).
PACKED_ATTENTION_PIECES = (packed_qkv_rows, attn_residual, packed_mlp)


def folded_layers(layers, h: Tensor, gates: FoldGates, tables: PositionTables, attend: Attend,
                  gate: str = "layer", pieces=FOLDED_PIECES) -> Tensor:
    """SPEC section 2's decoder layers over the residual streams ``h`` [N, B, C]: per layer the gate
    (``gates``), the position-wise part before attention on the computed rows only (``tables``: the RoPE
    tables of every flat position ``n * B + b``), every row attending with its (possibly inherited) q over
    the prefix and its own branch's k/v (``attend``), and the MLP on the computed rows, folded rows adding
    their origin's output to their own residual. ``gate="sublayer"`` re-gates the MLP at ``h_mid``.
    ``pieces``: the three position-wise functions (``FOLDED_PIECES``, or the same compiled; with
    ``PACKED_ATTENTION_PIECES``, ``attend`` takes the packed rows' q, k, v)."""
    qkv, attn_out, mlp = pieces
    for index, layer in enumerate(layers):
        # Attention sublayer: position-wise part on the computed rows only. Folded rows take their
        # origin's q, k, v; every row attends over the shared prefix and its own branch's block (so a
        # recomputed position reaches the folded positions of its branch).
        rows, slot = gates(h)
        q, k, v = qkv(layer, h, rows, slot, tables)  # [N, B, H, D] (packed: [P, H, D])
        h_mid = attn_out(layer, h, attend(index, layer, q, k, v, rows, slot))

        # MLP sublayer: computed rows only; folded rows add their origin's output to their own residual.
        if gate == "sublayer":
            rows, slot = gates(h_mid)
        h = mlp(layer, h_mid, rows, slot)
    return h


@torch.no_grad()
def folded_verify(model: BlockDiffusionLM, tokens: Tensor, parents: Tensor, cache: PrefixCache,
                  tau: float | Tensor, fold_masks: list[Tensor] | None = None, gate: str = "layer",
                  fold_head: bool = False) -> tuple[Tensor, list[Tensor]]:
    """SPEC section 2 for ``model(tokens, parents, cache)``. Returns ``(logits, fold_masks)``.

    ``fold_masks`` holds one bool ``[N, B]`` mask per gate: one per layer with ``gate="layer"``, two per
    layer (attention, then MLP at ``h_mid``) with ``gate="sublayer"``, plus one for the final norm and LM
    head with ``fold_head=True`` (folded rows take their origin's logits). Passing them forces the folds
    instead of evaluating the gate (SPEC P4).
    """
    check_gate(gate)
    model.check_inputs(tokens, parents, cache)
    gates = FoldGates(parents, tau, fold_masks)
    n_gates = gate_count(len(model.layers), gate, fold_head)
    if fold_masks is not None and len(fold_masks) != n_gates:
        raise ValueError(f"fold_masks: expected {n_gates} masks, got {len(fold_masks)}")

    block = tokens.shape[1]
    h = model.embed_tokens(tokens)  # [N, B, C]: every branch keeps its own residual stream
    channels = h.shape[-1]
    pos = model.position_tables(torch.arange(block, device=tokens.device) + cache.length)

    def attend(index, layer, q, k, v, rows, slot):
        return branch_attention_ref(q, k, v, cache.keys[index], cache.values[index], layer.scale,
                                    prefix_len=cache.device_length)

    n_rows = tokens.shape[0]
    flat = PositionTables(*(None if t is None else t.repeat(n_rows, *([1] * (t.dim() - 1)))
                            for t in (pos.cos, pos.sin, pos.q_scale)))  # one entry a flat position n * B + b
    h = folded_layers(model.layers, h, gates, flat, attend, gate)

    # The family's logit shift, applied to the hidden states before the row-wise norm and head (as the
    # model's verify does): the same logits as shifting them after. With fold_head the head's gate sees
    # the shifted states, so position p's decision is the one position p-1 would get unshifted.
    h = model.shift(h)
    if fold_head:
        rows, slot = gates(h)
        logits = model.head(model.norm(h.reshape(-1, channels)[rows]))[slot]  # [N, B, V]
    else:
        logits = model.head(model.norm(h))
    return logits, gates.masks
