"""The verification model shared by both families: the multi-branch verification forward and its checks.

``BlockDiffusionLM`` composes the pieces kept in their own files: the layers (``layers``), the prefix
cache passes (``cache``), the plain sequence pass used by prefill and training (``sequence``) and the
input checks (``checks``). Layout conventions: ``layers``' docstring.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor, nn

from .. import ops
from .cache import PrefixCache, PrefixCacheMethods
from .checks import check_input_shapes, check_values
from .config import ModelConfig
from .layers import MLP, AttentionProjections, Backbone, PositionTables, fuse_linears
from .sequence import SequenceForward

__all__ = ["BlockDiffusionLM", "PrefixCache", "PositionTables", "check_values"]

_model_ids = itertools.count(1)


class BlockDiffusionLM(PrefixCacheMethods, SequenceForward, nn.Module):
    """Shared forward of both families; subclasses own the modules and checkpoint names.

    Subclasses provide ``backbone`` (a ``Backbone``: embed_tokens, layers, norm), ``rotary`` (callable
    positions -> (cos, sin) [S, D]) and ``head(h)``; the checkpoint names follow from where they live.
    The prefill and block writes come from ``cache.PrefixCacheMethods``, the training forward from
    ``sequence.SequenceForward``.
    """

    config: ModelConfig

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model_uid = next(_model_ids)

    # --- pieces -------------------------------------------------------------------------------
    backbone: "Backbone"

    @property
    def embed_tokens(self) -> nn.Module:
        return self.backbone.embed_tokens

    @property
    def layers(self) -> nn.ModuleList:
        return self.backbone.layers

    @property
    def norm(self) -> nn.Module:
        return self.backbone.norm

    def head(self, h: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def _param_dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def position_tables(self, positions: Tensor) -> PositionTables:
        cos, sin = self.rotary(positions)
        dtype = self._param_dtype
        q_scale = None
        cfg = self.config
        if cfg.llama4_scaling_beta is not None:
            scale = 1 + cfg.llama4_scaling_beta * torch.log1p(
                torch.floor(positions.float() / cfg.llama4_original_max_position))
            q_scale = scale.to(dtype)[:, None, None]
        return PositionTables(cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :], q_scale)

    def shift(self, x: Tensor) -> Tensor:
        """Fast-dLLM v2: position p reads the logit computed at p-1, and position 0 the one computed at the
        block's last position B-1: the distribution of the token right after the block, i.e. of the next
        block's position 0 (position 0 of a block is never masked, so no commit reads it; the decode loop
        reads it as its guess of the next block's seed, ``generate(fuse_boundaries=True)``). ``x`` is
        [..., B, C] logits or, equally, the hidden states before the row-wise final norm and LM head
        (``verify`` shifts those: a copy of [N, B, hidden] instead of [N, B, vocab])."""
        if not self.config.shift_logits:
            return x
        return torch.cat((x[..., -1:, :], x[..., :-1, :]), dim=-2)

    # --- the verification forward ----------------------------------------------------------------
    def forward(self, tokens: Tensor, parents: Tensor, cache: PrefixCache,
                logit_positions: Tensor | None = None) -> Tensor:
        """Multi-branch verification: tokens int64 [N, B] (row 0 main), parents int64 [N] -> logits [N, B, V].

        Each row attends to the shared prefix cache and bidirectionally to its own row. The family's
        logit shift is applied (``shift_logits``): logits[n, p] is always the distribution of position p.

        ``logit_positions`` (int64 [M], flat indices ``n * B + p``): return only those positions' logits,
        [M, V] in the given order (HF's ``logits_to_keep``). The decode loop reads the logits of masked
        positions only (59-62% of a multi-branch call's rows on the trained model); the final norm and LM
        head then run on those rows alone. Every layer still runs on every row (the block attends
        bidirectionally).
        """
        self.check_inputs(tokens, parents, cache, logit_positions)
        return self.verify(tokens, parents, cache, logit_positions)

    def verify(self, tokens: Tensor, parents: Tensor, cache: PrefixCache,
               logit_positions: Tensor | None = None) -> Tensor:
        """``forward`` without the input checks (``forward`` runs them outside any traced graph and skips
        its data checks while a CUDA graph is captured, so both can be compiled and captured)."""
        n_rows, block = tokens.shape
        h = self.embed_tokens(tokens)
        h = ops.mark_branches(h, parents)
        # A static cache's length lives on the device (the graph must not bake it in); a dynamic cache's
        # is its shape.
        prefix_len = cache.keys[0].shape[1] if cache.device_length is None else cache.device_length
        positions = torch.arange(block, device=tokens.device) + prefix_len
        pos = self.position_tables(positions)
        for layer, k_pre, v_pre in zip(self.layers, cache.keys, cache.values):
            h = layer(h, pos, k_pre, v_pre, cache.device_length)
        if logit_positions is not None:
            # Gather the rows first: the final norm and the head are row-wise. The shift is an index here.
            rows = self.logit_rows(logit_positions, block)
            return self.head(self.norm(h.flatten(0, 1).index_select(0, rows)))
        # The shift before the row-wise norm and head: the same logits, without a second [N, B, vocab] copy.
        return self.head(self.norm(self.shift(h)))

    def logit_rows(self, logit_positions: Tensor, block: int) -> Tensor:
        """Flat hidden-state rows whose head output is the logits of ``logit_positions`` (``n * B + p``):
        the positions themselves, or with the Fast-dLLM shift ``p - 1`` (position 0 the block's last, B-1,
        as ``shift``)."""
        if not self.config.shift_logits:
            return logit_positions
        first = (logit_positions % block == 0).to(logit_positions.dtype)
        return logit_positions - 1 + first * block

    @torch.compiler.disable
    def check_inputs(self, tokens: Tensor, parents: Tensor, cache: PrefixCache,
                     logit_positions: Tensor | None = None) -> None:
        """Shape, dtype and device checks (``checks.check_input_shapes``), and the data checks (token range,
        parent order, the range of ``logit_positions``: ``check_values``, looked up in this module so a test
        can stand in for a captured call), on every call launched from the host, compiled or not.

        ``torch.compiler.disable``: under ``torch.compile`` the checks run outside the traced graph (a
        graph break at the first statement of ``forward``, so the verification forward after it is still
        one graph), hence a compiled model rejects bad data with the eager ValueError instead of indexing
        out of bounds. The data checks read values back to the host, which nothing may do while a CUDA
        graph is being captured: there they are skipped, and the decode loop (``decoding.generate`` with
        ``cuda_graphs``) builds and validates the rows it captures and replays itself."""
        check_input_shapes(self.config, self.model_uid, len(self.layers), tokens, parents, cache, logit_positions)
        check_values(tokens, parents, logit_positions, self.config.vocab_size)

    def fuse_projections(self) -> "BlockDiffusionLM":
        """Each layer's q/k/v projections as one GEMM (``self_attn.qkv_proj``) and gate/up as one
        (``mlp.gate_up_proj``), as gpt-fast and vLLM keep them: two launches a layer instead of five,
        and for the folded forward two packed linears instead of five. Same outputs (to float rounding);
        state_dict and checkpoint names stay the parts' (``fuse_linears``). Idempotent; returns self."""
        for layer in self.layers:
            if not all(type(m) in (AttentionProjections, MLP) for m in (layer.self_attn, layer.mlp)):
                raise TypeError("fuse_projections: this model's layers are not the package's own modules "
                                "(a from_hf model shares its weights with transformers; fusing would copy them)")
            if not hasattr(layer.self_attn, "qkv_proj"):
                fuse_linears(layer.self_attn, ["q_proj", "k_proj", "v_proj"], "qkv_proj")
            if not hasattr(layer.mlp, "gate_up_proj"):
                fuse_linears(layer.mlp, ["gate_proj", "up_proj"], "gate_up_proj")
        return self
