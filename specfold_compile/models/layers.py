"""The decoder's layers: RMSNorm, fused linears, the SwiGLU MLP, attention projections, RoPE (YaRN included),
the position tables, the decoder layer and the backbone, and the seeded init.

Layout conventions (they are what the compiler passes rely on):
* activations are ``[N, B, C]`` (branch, position in block, channels); heads are split as
  ``[N, B, H, D]`` and never transposed, so every op before attention keeps (branch, position) as its
  two leading dims;
* the only op that mixes positions is ``specfold::branch_attention`` (see ``ops.py``);
* RoPE tables are ``[B, 1, D]`` and depend on the position alone, shared by every branch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import ops
from .config import ModelConfig

__all__ = ["RMSNorm", "FusedLinear", "fuse_linears", "MLP", "AttentionProjections", "rotate_half", "apply_rope",
           "RotaryEmbedding", "PositionTables", "DecoderLayer", "Backbone", "init_weights"]


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


def init_weights(module: nn.Module, std: float, generator: torch.Generator) -> None:
    """Seeded init: normal(0, std) for matrices, embeddings and biases (random biases, so tests exercise
    them), ones for norms."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=generator)
