"""The folded verification forward of SPEC.md section 2, in plain PyTorch.

This is the oracle for the compiler passes and the kernels: a loop over layers with the gate, the
origin map and the packing written out. Clarity beats speed here.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .kernels.attention_ref import branch_attention_ref
from .kernels.gate_ref import fold_flags_ref, resolve_folds_ref
from .models.transformer import BlockDiffusionLM, PositionTables, PrefixCache

GATES = ("layer", "sublayer")


def check_tau(tau: float | Tensor) -> Tensor:
    value = float(tau)
    if math.isnan(value) or value < 0:
        raise ValueError(f"tau: expected a number >= 0, got {value}")
    return torch.tensor(value, dtype=torch.float32)


def _gate(h: Tensor, parents: Tensor, tau: Tensor, forced: Tensor | None) -> Tensor:
    if forced is None:
        return fold_flags_ref(h, parents, tau.to(h.device))
    if forced.shape != h.shape[:2] or forced.dtype != torch.bool:
        raise ValueError(f"fold_masks: expected bool masks of shape {tuple(h.shape[:2])}, got "
                         f"{forced.dtype} {tuple(forced.shape)}")
    if bool(forced[0].any()):
        raise ValueError("fold_masks: row 0 (the main branch) never folds")
    return forced.to(h.device)


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
    if gate not in GATES:
        raise ValueError(f"gate: expected one of {GATES}, got {gate!r}")
    model.check_inputs(tokens, parents, cache)
    tau_t = check_tau(tau)
    n_gates = (2 if gate == "sublayer" else 1) * len(model.layers) + int(fold_head)
    if fold_masks is not None and len(fold_masks) != n_gates:
        raise ValueError(f"fold_masks: expected {n_gates} masks, got {len(fold_masks)}")
    forced = iter(fold_masks) if fold_masks is not None else None

    n_rows, block = tokens.shape
    h = model.embed_tokens(tokens)  # [N, B, C]: every branch keeps its own residual stream
    channels = h.shape[-1]
    positions = torch.arange(block, device=tokens.device) + cache.length
    pos = model.position_tables(positions)
    used: list[Tensor] = []

    def plan(state: Tensor) -> tuple[Tensor, Tensor]:
        """Gate -> origin -> packing: the computed rows (flat n*B+b) and each row's origin slot among them."""
        fold = _gate(state, parents, tau_t, next(forced) if forced is not None else None)
        used.append(fold)
        _, rows, count, slot = resolve_folds_ref(fold, parents)
        return rows[: int(count)], slot

    for layer, k_pre, v_pre in zip(model.layers, cache.keys, cache.values):
        # Attention sublayer: position-wise part on the computed rows only.
        rows, slot = plan(h)
        row_pos = rows % block
        packed_pos = PositionTables(pos.cos[row_pos], pos.sin[row_pos],
                                    None if pos.q_scale is None else pos.q_scale[row_pos])
        q_p, k_p, v_p = layer.qkv(h.reshape(-1, channels)[rows], packed_pos)  # [R, H, D]
        # Folded rows take their origin's q, k, v; every row attends over the shared prefix and its
        # own branch's block (so a recomputed position reaches the folded positions of its branch).
        q, k, v = q_p[slot], k_p[slot], v_p[slot]  # [N, B, H, D]
        o = branch_attention_ref(q, k, v, k_pre, v_pre, layer.scale, prefix_len=cache.device_length)
        h_mid = h + layer.attn_out(o)

        # MLP sublayer: computed rows only; folded rows add their origin's output to their own residual.
        if gate == "sublayer":
            rows, slot = plan(h_mid)
        m_p = layer.mlp_out(h_mid.reshape(-1, channels)[rows])  # [R, C]
        h = h_mid + m_p[slot]

    # The family's logit shift, applied to the hidden states before the row-wise norm and head (as the
    # model's verify does): the same logits as shifting them after. With fold_head the head's gate sees
    # the shifted states, so position p's decision is the one position p-1 would get unshifted.
    h = model.shift(h)
    if fold_head:
        rows, slot = plan(h)
        logits = model.head(model.norm(h.reshape(-1, channels)[rows]))[slot]  # [N, B, V]
    else:
        logits = model.head(model.norm(h))
    return logits, used
