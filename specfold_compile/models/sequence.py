"""The plain (single-sequence) transformer pass behind the prefill, block writes and training.

``SequenceForward`` is the part of ``BlockDiffusionLM`` that runs the layers over ordinary sequences
with an explicit attention mask (``F.scaled_dot_product_attention``), where the verification forward
runs them over branches through ``ops.branch_attention``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["SequenceForward"]


class SequenceForward:
    """``BlockDiffusionLM``'s sequence passes. Uses the model's ``embed_tokens``, ``layers``, ``norm``,
    ``head`` and ``position_tables``."""

    def _sequence(self, ids: Tensor, positions: Tensor, allowed: Tensor,
                  cache: tuple[list[Tensor], list[Tensor]] | None, keep_kv: bool = True,
                  write_at: Tensor | None = None) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Plain transformer over ids [b, S]; allowed: bool [b or 1, S, P+S] (True = may attend);
        cache: the prefix's per-layer (keys, values) [Hkv, P, D], or None.

        Returns the final hidden states [b, S, C] and (``keep_kv``) the per-layer K/V [Hkv, P+S, D] of the
        first sequence. ``write_at`` ([S] key indices, b = 1): the cache is a static cache's buffers
        [Hkv, capacity, D]; each layer writes its block K/V into them there, in place, and attends over
        the whole buffers (``allowed`` is then [1, S, capacity]); nothing is returned for the K/V.
        """
        h = self.embed_tokens(ids)
        pos = self.position_tables(positions)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(h, pos)  # [b, S, H, D]
            if write_at is not None:
                cache[0][i].index_copy_(1, write_at, k[0].transpose(0, 1))
                cache[1][i].index_copy_(1, write_at, v[0].transpose(0, 1))
                k_all, v_all = cache[0][i].transpose(0, 1)[None], cache[1][i].transpose(0, 1)[None]
            elif cache is not None:
                k_all = torch.cat((cache[0][i].transpose(0, 1).unsqueeze(0), k), dim=1)
                v_all = torch.cat((cache[1][i].transpose(0, 1).unsqueeze(0), v), dim=1)
            else:
                k_all, v_all = k, v
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k_all.transpose(1, 2), v_all.transpose(1, 2), attn_mask=allowed[:, None],
                scale=layer.scale, enable_gqa=True).transpose(1, 2)
            h = h + layer.attn_out(o)
            h = h + layer.mlp_out(h)
            if keep_kv and write_at is None:  # prefill / block writes keep the K/V (training: not needed)
                keys.append(k_all[0].transpose(0, 1).contiguous())
                values.append(v_all[0].transpose(0, 1).contiguous())
        return self.norm(h), keys, values

    def forward_sequence(self, ids: Tensor, positions: Tensor, attn_mask: Tensor) -> Tensor:
        """Training/analysis forward: ids [b, S], positions [S], attn_mask bool [S, S] or [b, S, S]
        (True = may attend). Returns raw logits [b, S, V] (no shift)."""
        mask = attn_mask if attn_mask.dim() == 3 else attn_mask[None]
        h, _, _ = self._sequence(ids, positions, mask, None, keep_kv=False)
        return self.head(h)
