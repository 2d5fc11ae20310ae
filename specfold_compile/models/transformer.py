"""The decoder shared by both families: layers, RoPE, the prefix cache and the verification forward.

Layout conventions (they are what the compiler passes rely on):
* activations are ``[N, B, C]`` (branch, position in block, channels); heads are split as
  ``[N, B, H, D]`` and never transposed, so every op before attention keeps (branch, position) as its
  two leading dims;
* the only op that mixes positions is ``specfold::branch_attention`` (see ``ops.py``);
* RoPE tables are ``[B, 1, D]`` and depend on the position alone, shared by every branch.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import ops
from .config import ModelConfig

_model_ids = itertools.count(1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class FusedLinear(nn.Module):
    """Linears of one input as one GEMM, as gpt-fast and vLLM keep q/k/v and gate/up: one weight
    [sum of outputs, in] (and bias); ``forward`` returns the parts' outputs, split along the last dim.
    Made by ``fuse_linears``, which keeps the parts' checkpoint names in the parent's state_dict."""

    def __init__(self, parts: list[nn.Linear]):
        super().__init__()
        self.sizes = [part.out_features for part in parts]
        self.weight = nn.Parameter(torch.cat([part.weight.detach() for part in parts]))
        has_bias = [part.bias is not None for part in parts]
        if any(has_bias) and not all(has_bias):
            raise ValueError("fuse_linears: expected all parts with a bias or none")
        self.bias = nn.Parameter(torch.cat([part.bias.detach() for part in parts])) if all(has_bias) else None

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        return F.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)


def fuse_linears(parent: nn.Module, names: list[str], fused_name: str) -> None:
    """Replace ``parent``'s nn.Linear children ``names`` (same input size) by one ``FusedLinear``
    ``fused_name``. ``parent.state_dict()`` still names the parts (views of the fused tensors, so
    copying into them, as ``checkpoint.load_weights`` does, writes the fused weight) and
    ``load_state_dict`` takes the parts' names: checkpoints save and load unchanged."""
    parts = [getattr(parent, name) for name in names]
    if not all(type(part) is nn.Linear for part in parts) or len({part.in_features for part in parts}) != 1:
        raise TypeError(f"fuse_linears: {names} must be nn.Linear of one input size")
    fused = FusedLinear(parts)
    for name in names:
        delattr(parent, name)
    setattr(parent, fused_name, fused)
    kinds = ("weight", "bias") if fused.bias is not None else ("weight",)

    def split_names(module, state_dict, prefix, local_metadata):
        for kind in kinds:
            whole = state_dict.pop(f"{prefix}{fused_name}.{kind}")
            for name, piece in zip(names, whole.split(fused.sizes)):
                state_dict[f"{prefix}{name}.{kind}"] = piece

    def join_names(module, state_dict, prefix, *args):
        for kind in kinds:
            keys = [f"{prefix}{name}.{kind}" for name in names]
            if all(key in state_dict for key in keys):
                state_dict[f"{prefix}{fused_name}.{kind}"] = torch.cat([state_dict.pop(key) for key in keys])

    parent.register_state_dict_post_hook(split_names)
    parent.register_load_state_dict_pre_hook(join_names)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); gate and up may be fused (``gate_up_proj``)."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if hasattr(self, "gate_up_proj"):
            gate, up = self.gate_up_proj(x)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class AttentionProjections(nn.Module):
    """q/k/v/o projections (named as in the checkpoints); attention itself is ``ops.branch_attention``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        c, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(c, cfg.num_heads * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(c, cfg.num_kv_heads * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(c, cfg.num_kv_heads * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.num_heads * hd, c, bias=False)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [..., H, D]; cos/sin broadcastable, e.g. [B, 1, D] for x of shape [N, B, H, D]."""
    return x * cos + rotate_half(x) * sin


def _yarn_inv_freq(dim: int, base: float, scaling: dict) -> tuple[Tensor, float]:
    """YaRN (arXiv 2309.00071): interpolate low frequencies, keep high ones, blend with a linear ramp."""
    factor = float(scaling["factor"])
    orig = float(scaling["original_max_position_embeddings"])
    beta_fast, beta_slow = float(scaling.get("beta_fast", 32.0)), float(scaling.get("beta_slow", 1.0))

    def correction_dim(rotations: float) -> float:
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # 1 where the frequency is high enough to extrapolate unchanged
    inv_freq = interpolation * (1 - keep) + extrapolation * keep

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if (m and m_all) else mscale(factor)
    return inv_freq, float(attention_factor)


class RotaryEmbedding(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        dim = cfg.head_dim
        if cfg.rope_scaling:
            inv_freq, self.attention_factor = _yarn_inv_freq(dim, cfg.rope_theta, cfg.rope_scaling)
        else:
            inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
            self.attention_factor = 1.0
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _apply(self, fn, recurse=True):
        # Follow device moves but never a dtype cast: bf16 frequencies would shift every angle.
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = inv_freq.to(device=self.inv_freq.device)
        return self

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions: int64 [S] -> cos, sin float32 [S, D]."""
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_factor, emb.sin() * self.attention_factor


@dataclass
class PositionTables:
    """Everything position-dependent a layer needs, computed once per forward and shared by all branches."""

    cos: Tensor  # [S, 1, D], model dtype
    sin: Tensor  # [S, 1, D]
    q_scale: Tensor | None  # [S, 1, 1] (Llama-4 query scaling) or None


class DecoderLayer(nn.Module):
    """Pre-norm layer: h + o_proj(attn(qkv(norm(h)))), then h + mlp(norm(h)).

    The attributes are named as in Qwen2/Mistral checkpoints, so the same class wraps transformers'
    own modules in ``from_hf``.
    """

    def __init__(self, self_attn: nn.Module, mlp: nn.Module, input_layernorm: nn.Module,
                 post_attention_layernorm: nn.Module, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = input_layernorm
        self.post_attention_layernorm = post_attention_layernorm
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5

    # The three position-wise pieces, also used one by one by reference.folded_verify.
    def qkv(self, h: Tensor, pos: PositionTables) -> tuple[Tensor, Tensor, Tensor]:
        x = self.input_layernorm(h)
        lead = x.shape[:-1]
        attn = self.self_attn
        q, k, v = attn.qkv_proj(x) if hasattr(attn, "qkv_proj") else (attn.q_proj(x), attn.k_proj(x), attn.v_proj(x))
        q = q.view(*lead, self.num_heads, self.head_dim)
        k = k.view(*lead, self.num_kv_heads, self.head_dim)
        v = v.view(*lead, self.num_kv_heads, self.head_dim)
        q = apply_rope(q, pos.cos, pos.sin)
        k = apply_rope(k, pos.cos, pos.sin)
        if pos.q_scale is not None:
            q = q * pos.q_scale
        return q, k, v

    def attn_out(self, o: Tensor) -> Tensor:
        return self.self_attn.o_proj(o.reshape(*o.shape[:-2], self.num_heads * self.head_dim))

    def mlp_out(self, h_mid: Tensor) -> Tensor:
        return self.mlp(self.post_attention_layernorm(h_mid))

    def forward(self, h: Tensor, pos: PositionTables, k_pre: Tensor, v_pre: Tensor,
                prefix_len: Tensor | None = None) -> Tensor:
        q, k, v = self.qkv(h, pos)
        o = ops.branch_attention(q, k, v, k_pre, v_pre, self.scale, prefix_len)
        h = h + self.attn_out(o)
        return h + self.mlp_out(h)


class Backbone(nn.Module):
    """embed_tokens / layers / norm, named as in Qwen2 (``model.*``) and NLD (``encoder.*``) checkpoints."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(AttentionProjections(cfg), MLP(cfg.hidden_size, cfg.intermediate_size),
                         RMSNorm(cfg.hidden_size, cfg.rms_norm_eps), RMSNorm(cfg.hidden_size, cfg.rms_norm_eps),
                         cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
            for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass
class PrefixCache:
    """The shared prefix K/V: one copy per layer, ``[Hkv, P, D]``, read by every branch through views.

    ``next_logits`` ([V]) predicts the token right after the prefix (the next block's seed).

    A static cache (``BlockDiffusionLM.static_cache``) has a fixed capacity instead: ``[Hkv, capacity,
    D]`` buffers whose first ``length`` keys are the prefix, the length also held on the device in
    ``device_length`` (int64 [1]), which the verification forward reads (RoPE positions, the attention's
    valid keys). Block writes copy into the buffers in place and update both lengths, so every tensor a
    verification call reads keeps its address and shape from block to block: what a CUDA graph replay
    needs (``decoding.cuda_graphs``).
    """

    keys: list[Tensor]
    values: list[Tensor]
    next_logits: Tensor | None
    owner: int
    device_length: Tensor | None = None  # static caches only
    static_length: int = 0               # static caches only: device_length's value, known to the host

    @property
    def length(self) -> int:
        if self.device_length is not None:
            return self.static_length
        return int(self.keys[0].shape[1]) if self.keys else 0

    @property
    def capacity(self) -> int:
        """Keys the buffers hold (= ``length`` for a dynamic cache)."""
        return int(self.keys[0].shape[1]) if self.keys else 0


class BlockDiffusionLM(nn.Module):
    """Shared forward of both families; subclasses own the modules and checkpoint names.

    Subclasses provide ``backbone`` (a ``Backbone``: embed_tokens, layers, norm), ``rotary`` (callable
    positions -> (cos, sin) [S, D]) and ``head(h)``; the checkpoint names follow from where they live.
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
        """Fast-dLLM v2: position p reads the logit computed at p-1; position 0 reads its own. ``x`` is
        [..., B, C] logits or, equally, the hidden states before the row-wise final norm and LM head
        (``verify`` shifts those: a copy of [N, B, hidden] instead of [N, B, vocab])."""
        if not self.config.shift_logits:
            return x
        return torch.cat((x[..., :1, :], x[..., :-1, :]), dim=-2)

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
        the positions themselves, or with the Fast-dLLM shift ``p - 1`` (position 0 its own, as ``shift``)."""
        if not self.config.shift_logits:
            return logit_positions
        return logit_positions - (logit_positions % block != 0).to(logit_positions.dtype)

    @torch.compiler.disable
    def check_inputs(self, tokens: Tensor, parents: Tensor, cache: PrefixCache,
                     logit_positions: Tensor | None = None) -> None:
        """Shape, dtype and device checks, and the data checks (token range, parent order, the range of
        ``logit_positions``: ``check_values``), on every call launched from the host, compiled or not.

        ``torch.compiler.disable``: under ``torch.compile`` the checks run outside the traced graph (a
        graph break at the first statement of ``forward``, so the verification forward after it is still
        one graph), hence a compiled model rejects bad data with the eager ValueError instead of indexing
        out of bounds. The data checks read values back to the host, which nothing may do while a CUDA
        graph is being captured: there they are skipped, and the decode loop (``decoding.generate`` with
        ``cuda_graphs``) builds and validates the rows it captures and replays itself."""
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype != torch.int64:
            raise TypeError(f"tokens: expected an int64 tensor [N, B], got "
                            f"{getattr(tokens, 'dtype', type(tokens))} of shape {tuple(getattr(tokens, 'shape', ()))}")
        if not isinstance(parents, Tensor) or parents.dim() != 1 or parents.dtype != torch.int64:
            raise TypeError(f"parents: expected an int64 tensor [N], got {getattr(parents, 'dtype', type(parents))}")
        if parents.shape[0] != tokens.shape[0]:
            raise ValueError(f"parents: expected length N={tokens.shape[0]} (rows of tokens), got {parents.shape[0]}")
        if not isinstance(cache, PrefixCache):
            raise TypeError(f"cache: expected a PrefixCache from model.prefill, got {type(cache).__name__}")
        if cache.owner != self.model_uid:
            raise ValueError("cache: this prefix cache was built by another model")
        if len(cache.keys) != len(self.layers) or len(cache.values) != len(self.layers):
            raise ValueError(f"cache: expected {len(self.layers)} layers, got {len(cache.keys)}")
        # (Outside the traced graph, reading a static cache's host length specialises nothing.)
        if cache.device_length is not None and cache.device_length.device != tokens.device:
            raise ValueError(f"cache: device_length must be on the device of tokens ({tokens.device}), got "
                             f"{cache.device_length.device}")
        if cache.length + tokens.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"cache: prefix length {cache.length} + block {tokens.shape[1]} exceeds "
                             f"max_position_embeddings={self.config.max_position_embeddings}")
        if logit_positions is not None and (not isinstance(logit_positions, Tensor) or logit_positions.dim() != 1
                                            or logit_positions.dtype != torch.int64):
            raise TypeError(f"logit_positions: expected None or an int64 tensor [M] of flat positions n * B + p, "
                            f"got {getattr(logit_positions, 'dtype', type(logit_positions))} of shape "
                            f"{tuple(getattr(logit_positions, 'shape', ()))}")
        if logit_positions is not None and logit_positions.device != tokens.device:
            raise ValueError(f"logit_positions: expected the device of tokens ({tokens.device}), got "
                             f"{logit_positions.device}")
        check_values(tokens, parents, logit_positions, self.config.vocab_size)

    # --- sequence passes: prefill, block writes, training ---------------------------------------
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

    def empty_cache(self, device: torch.device | str | None = None) -> PrefixCache:
        cfg = self.config
        device = device or self.embed_tokens.weight.device
        empty = [torch.empty(cfg.num_kv_heads, 0, cfg.head_dim, dtype=self._param_dtype, device=device)
                 for _ in range(cfg.num_layers)]
        return PrefixCache(empty, [t.clone() for t in empty], None, self.model_uid)

    @torch.no_grad()
    def prefill(self, prompt_ids: Tensor, compiled: bool = False, block_causal: bool = False) -> PrefixCache:
        """One pass over a prompt (1-D int64) into a new prefix cache; the last position's logits predict
        the next token (``next_logits``).

        The mask: causal by default (NLD's prefill). ``block_causal``: the mask Fast-dLLM v2 is trained and
        prefilled with (``block_causal_mask``): bidirectional inside each absolute block ``[kB, kB + B)``,
        causal across blocks; its decoder passes the prompt's whole blocks. An empty prompt gives the
        empty cache (no forward, ``next_logits`` None). ``compiled``: as in ``write_block`` (one graph for
        prompts of any length under each mask)."""
        if not isinstance(prompt_ids, Tensor) or prompt_ids.dim() != 1 or prompt_ids.dtype != torch.int64:
            raise TypeError("prompt_ids: expected a 1-D int64 tensor")
        for name, flag in (("compiled", compiled), ("block_causal", block_causal)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
        if prompt_ids.numel() and (int(prompt_ids.min()) < 0 or int(prompt_ids.max()) >= self.config.vocab_size):
            raise ValueError(f"prompt_ids: ids must lie in [0, {self.config.vocab_size})")
        if prompt_ids.numel() > self.config.max_position_embeddings:
            raise ValueError(f"prompt_ids: {prompt_ids.numel()} tokens exceed "
                             f"max_position_embeddings={self.config.max_position_embeddings}")
        empty = self.empty_cache(prompt_ids.device)
        if prompt_ids.numel() == 0:
            return empty
        if not block_causal:
            return self.write_block(empty, prompt_ids, causal=True, compiled=compiled)
        run = self.prefill_block_causal
        if compiled:
            run = self.compiled_method("prefill_block_causal")
            if prompt_ids.numel() > 1:  # one graph for every prompt length
                torch._dynamo.maybe_mark_dynamic(prompt_ids, 0)
        keys, values, next_logits = run(prompt_ids)
        return PrefixCache(keys, values, next_logits, self.model_uid)

    def prefill_block_causal(self, prompt_ids: Tensor) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """``prefill(block_causal=True)``'s tensor work, without checks or host reads (so it compiles):
        prompt_ids [S] -> the per-layer K/V [Hkv, S, D] and the last position's logits [V]."""
        positions = torch.arange(prompt_ids.shape[0], device=prompt_ids.device)
        allowed = block_causal_mask(positions, positions, self.config.block_size)
        h, keys, values = self._sequence(prompt_ids[None], positions, allowed[None], None)
        return keys, values, self.head(h[0, -1])

    @torch.no_grad()
    def static_cache(self, cache: PrefixCache, capacity: int | None = None, out: PrefixCache | None = None
                     ) -> PrefixCache:
        """``cache``'s prefix in a static cache (``PrefixCache``): new buffers of ``capacity`` keys, or
        copied into the static cache ``out`` in place (its buffers, device length and so any CUDA graph
        captured on it stay valid). Capacity beyond the prefix is for the blocks ``write_block`` adds."""
        if not isinstance(cache, PrefixCache) or cache.owner != self.model_uid:
            raise TypeError("cache: expected a PrefixCache of this model (from model.prefill)")
        length = cache.length
        if out is None:
            if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < max(length, 1):
                raise ValueError(f"capacity: expected an int >= the prefix length {max(length, 1)}, got {capacity!r}")
            dev = cache.keys[0].device
            shape = (self.config.num_kv_heads, capacity, self.config.head_dim)
            out = PrefixCache([cache.keys[0].new_zeros(shape) for _ in cache.keys],
                              [cache.values[0].new_zeros(shape) for _ in cache.values], None, self.model_uid,
                              torch.zeros(1, dtype=torch.int64, device=dev), 0)
        elif not isinstance(out, PrefixCache) or out.device_length is None or out.owner != self.model_uid:
            raise TypeError("out: expected a static PrefixCache of this model (from model.static_cache)")
        elif out.capacity < length:
            raise ValueError(f"out: capacity {out.capacity} is below the prefix length {length}")
        for buf, src in zip((*out.keys, *out.values), (*cache.keys, *cache.values)):
            buf[:, :length].copy_(src[:, :length])
        out.device_length.fill_(length)
        out.static_length, out.next_logits = length, cache.next_logits
        return out

    @torch.no_grad()
    def write_block(self, cache: PrefixCache, block_tokens: Tensor, causal: bool | None = None,
                    compiled: bool = False) -> PrefixCache:
        """Append a finished block to the prefix cache (returns a new cache; a static cache is updated in
        place and returned: its buffers keep their addresses).

        Fast-dLLM v2 writes the block attending bidirectionally to itself; NLD writes it causally.
        The last position's logits become ``next_logits`` (the next block's seed).
        ``compiled``: run the tensor work (``append_block``, or ``append_block_static`` on a static
        cache) through ``torch.compile`` with its default backend (compiled on first use and kept; on a
        dynamic cache one graph for prompts and one for block writes, each dynamic in its length;
        gpt-fast's ``compile_prefill``). The checks here stay eager.
        """
        p, s, causal = self.check_block(cache, block_tokens, causal, compiled)
        if cache.device_length is not None:
            append_static = self.compiled_method("append_block_static") if compiled else self.append_block_static
            cache.next_logits = append_static(cache.keys, cache.values, cache.device_length, block_tokens, causal)
            cache.static_length = p + s
            return cache
        append = self.append_block
        if compiled:
            append = self.compiled_method("append_block")
            # Lengths change every call: trace them as dynamic from the start (one graph for prompts,
            # P = 0, dynamic S; one for blocks, dynamic P) instead of recompiling on the second size.
            if s > 1 and p == 0:
                torch._dynamo.maybe_mark_dynamic(block_tokens, 0)
            if p > 1:
                for t in (*cache.keys, *cache.values):
                    torch._dynamo.maybe_mark_dynamic(t, 1)
        keys, values, next_logits = append(cache.keys, cache.values, block_tokens, causal)
        return PrefixCache(keys, values, next_logits, self.model_uid)

    def check_block(self, cache: PrefixCache, block_tokens: Tensor, causal: bool | None = None,
                    compiled: bool = False) -> tuple[int, int, bool]:
        """``write_block``'s argument checks (host reads included); returns the prefix length, the block
        length and ``causal`` resolved from the family when None."""
        if not isinstance(block_tokens, Tensor) or block_tokens.dim() != 1 or block_tokens.dtype != torch.int64:
            raise TypeError("block_tokens: expected a 1-D int64 tensor")
        if not isinstance(cache, PrefixCache):
            raise TypeError(f"cache: expected a PrefixCache from model.prefill, got {type(cache).__name__}")
        if cache.owner != self.model_uid:
            raise ValueError("cache: this prefix cache was built by another model")
        if not isinstance(compiled, bool):
            raise TypeError(f"compiled: expected a bool, got {type(compiled).__name__}")
        if causal is None:
            causal = self.config.family == "nld"
        s, p = block_tokens.shape[0], cache.length
        if p + s > self.config.max_position_embeddings:
            raise ValueError(f"block_tokens: prefix length {p} + {s} tokens exceeds "
                             f"max_position_embeddings={self.config.max_position_embeddings}")
        if cache.device_length is not None and p + s > cache.capacity:
            raise ValueError(f"block_tokens: prefix length {p} + {s} tokens exceeds the static cache's capacity "
                             f"{cache.capacity}")
        if s and (int(block_tokens.min()) < 0 or int(block_tokens.max()) >= self.config.vocab_size):
            raise ValueError(f"block_tokens: ids must lie in [0, {self.config.vocab_size})")
        return p, s, bool(causal)

    def append_block(self, keys: list[Tensor], values: list[Tensor], block_tokens: Tensor, causal: bool
                     ) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """``write_block``'s tensor work, without checks or host reads (so it compiles and graph-captures):
        per-layer prefix K/V [Hkv, P, D] and block_tokens [S] -> the K/V [Hkv, P+S, D] and the last
        position's logits [V]."""
        s, p = block_tokens.shape[0], keys[0].shape[1]
        device = block_tokens.device
        allowed = torch.ones(s, p + s, dtype=torch.bool, device=device)
        if causal:
            allowed[:, p:] = torch.ones(s, s, dtype=torch.bool, device=device).tril()
        positions = torch.arange(s, device=device) + p
        h, keys, values = self._sequence(block_tokens[None], positions, allowed[None], (keys, values))
        return keys, values, self.head(h[0, -1])

    def append_block_static(self, keys: list[Tensor], values: list[Tensor], device_length: Tensor,
                            block_tokens: Tensor, causal: bool) -> Tensor:
        """``append_block`` on a static cache's buffers [Hkv, capacity, D], in place: each layer writes the
        block's K/V at ``device_length`` and attends over the whole buffers with the keys past the block
        masked; ``device_length`` then advances by S; returns the last position's logits [V]. No host
        reads and shapes that do not depend on the prefix length, so one CUDA graph serves every block
        write of a decode loop (``VerifyGraphs.write_block``), and the prefix is never copied (the
        dynamic cache's ``torch.cat`` copies it once a block)."""
        s, capacity = block_tokens.shape[0], keys[0].shape[1]
        device = block_tokens.device
        positions = device_length + torch.arange(s, device=device)  # the block's keys and RoPE positions
        key_index = torch.arange(capacity, device=device)
        if causal:
            allowed = key_index[None, :] <= positions[:, None]
        else:
            allowed = (key_index < device_length + s)[None, :].expand(s, capacity)
        h, _, _ = self._sequence(block_tokens[None], positions, allowed[None], (keys, values), write_at=positions)
        device_length.add_(s)
        return self.head(h[0, -1])

    def compiled_method(self, name: str):
        """The method ``name`` under ``torch.compile`` (default backend), made on first use and kept out of
        the module's state: what ``write_block(compiled=True)`` runs."""
        compiled = self.__dict__.setdefault("_compiled_methods", {})
        if name not in compiled:
            compiled[name] = torch.compile(getattr(self, name))
        return compiled[name]


def block_causal_mask(query_positions: Tensor, key_positions: Tensor, block_size: int) -> Tensor:
    """bool [Sq, Sk], True where the query at absolute position q may attend the key at position k:
    k's block ``k // block_size`` is at most q's (bidirectional inside a block, causal across blocks; the
    mask Fast-dLLM v2 is trained with, and its prefill's)."""
    return (key_positions[None, :] // block_size) <= (query_positions[:, None] // block_size)


def check_values(tokens: Tensor, parents: Tensor, logit_positions: Tensor | None, vocab_size: int) -> None:
    """The data checks of ``check_inputs``: token ids in [0, vocab_size), parents in topological order,
    ``logit_positions`` in [0, N * B). One read back to the host for all of them; skipped while a CUDA
    graph is being captured (a read back is not allowed there)."""
    if tokens.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    if parents.numel() == 0 or tokens.numel() == 0:
        validate_parents(parents)  # no rows: names parents; rows of width 0 hold no ids to check
        return
    n_rows = parents.shape[0]
    rows = torch.arange(1, n_rows, device=parents.device)
    parents_ok = (parents[0] == -1) & ((parents[1:] >= 0) & (parents[1:] < rows)).all()
    stats = [tokens.min(), tokens.max(), parents_ok.to(device=tokens.device, dtype=torch.int64)]
    if logit_positions is not None and logit_positions.numel():
        stats += [logit_positions.min(), logit_positions.max()]
    values = torch.stack(stats).tolist()
    if not values[2]:
        validate_parents(parents)  # raises, naming the first bad row
    if len(values) > 3 and (values[3] < 0 or values[4] >= tokens.numel()):
        raise ValueError(f"logit_positions: flat positions must lie in [0, N * B = {tokens.numel()}), "
                         f"got [{values[3]}, {values[4]}]")
    if values[0] < 0 or values[1] >= vocab_size:
        raise ValueError(f"tokens: ids must lie in [0, {vocab_size}), got [{values[0]}, {values[1]}]")


def validate_parents(parents: Tensor) -> None:
    """parents[0] == -1 and 0 <= parents[n] < n for n >= 1 (rows in topological order)."""
    values = parents.tolist()
    if not values:
        raise ValueError("parents: expected at least one row (the main branch)")
    if values[0] != -1:
        raise ValueError(f"parents: parents[0] must be -1 (row 0 is the main branch), got {values[0]}")
    for n, p in enumerate(values[1:], start=1):
        if not 0 <= p < n:
            raise ValueError(f"parents: parents[{n}] must lie in [0, {n}) (rows in topological order), got {p}")


def init_weights(module: nn.Module, std: float, generator: torch.Generator) -> None:
    """Seeded init: normal(0, std) for matrices and embeddings, ones for norms, zeros for biases."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:  # biases too: random, so tests exercise them
                p.normal_(0.0, std, generator=generator)
