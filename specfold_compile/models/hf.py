"""Wrap a transformers causal LM (Qwen2 / Llama / Mistral) into the ``BlockDiffusionLM`` interface.

``from_hf(hf_model)`` reuses the model's own modules (no weight copy): every decoder layer becomes our
``DecoderLayer`` around transformers' ``self_attn`` (only its q/k/v/o projections are called), ``mlp``
and the two norms; the embedding, final norm and ``lm_head`` are the model's own, and RoPE comes from
``hf_model.model.rotary_emb`` (so Llama-3 / YaRN / linear rope scaling and its attention factor are
whatever transformers computes). Attention itself is ours: ``specfold::branch_attention`` in the
verification forward and SDPA with an explicit mask in ``prefill`` / ``write_block`` /
``forward_sequence``.

The block-diffusion settings are not in a plain causal LM's config, so they are arguments:

* ``block_size`` (default 32), ``sub_block_size`` (default None: commit anywhere in the block),
  ``shift_logits`` (default False);
* ``mask_token_id`` (default ``vocab_size - 1``; pass the real mask id when the vocabulary has one);
* ``eos_token_id`` (default: the config's, the first one when it is a list, else -1 = never stops);
* ``family``: only selects ``write_block``'s default mask (``"fast-dllm-v2"``: bidirectional inside the
  written block, ``"nld"``: causal). Default: ``"fast-dllm-v2"`` for Qwen2 (Fast-dLLM v2 is a Qwen2.5
  fine-tune), ``"nld"`` for Llama and Mistral.

Sliding-window attention (Mistral's ``sliding_window``, Qwen2's ``use_sliding_window``) is not
implemented; it equals full attention while every position is inside the window, so the wrapper's
``max_position_embeddings`` is capped at the window size and longer inputs are rejected.

A wrapped model shares its parameters with ``hf_model``: moving one moves both. Save it with
transformers' own ``hf_model.save_pretrained``; ``wrapped.save_pretrained`` raises.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .config import FAMILIES, FAST_DLLM_V2, NLD, ModelConfig
from .layers import DecoderLayer
from .transformer import BlockDiffusionLM

_SUPPORTED = ("Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _supported_classes() -> dict[str, type]:
    try:
        from transformers import LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("from_hf needs transformers (pip install 'specfold-compile[hf]')") from exc
    return {"Qwen2ForCausalLM": Qwen2ForCausalLM, "LlamaForCausalLM": LlamaForCausalLM,
            "MistralForCausalLM": MistralForCausalLM}


class _HFBackbone(nn.Module):
    """embed_tokens / layers / norm, the first and last being transformers' own modules."""

    def __init__(self, embed_tokens: nn.Module, layers: nn.ModuleList, norm: nn.Module):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.layers = layers
        self.norm = norm


class _HFRotary(nn.Module):
    """positions int64 [S] -> cos, sin float32 [S, D], through transformers' rotary embedding."""

    def __init__(self, rotary_emb: nn.Module):
        super().__init__()
        self.rotary_emb = rotary_emb

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        # The first argument only provides dtype and device: float32 keeps the tables unrounded.
        probe = torch.zeros((), dtype=torch.float32, device=positions.device)
        cos, sin = self.rotary_emb(probe, positions.reshape(1, -1))
        return cos[0].float(), sin[0].float()


class HFBlockDiffusionLM(BlockDiffusionLM):
    """A transformers causal LM seen through the ``BlockDiffusionLM`` interface (see ``from_hf``)."""

    def __init__(self, config: ModelConfig, backbone: _HFBackbone, lm_head: nn.Module, rotary: _HFRotary,
                 hf_model: nn.Module):
        super().__init__(config)
        # Named as in transformers' checkpoints (model.*, lm_head), so state_dict names match hf_model's.
        self.model = backbone
        self.lm_head = lm_head
        self.rotary = rotary
        self.__dict__["hf_model"] = hf_model  # a plain reference, not a submodule (no duplicate parameters)

    @property
    def backbone(self) -> _HFBackbone:
        return self.model

    def head(self, h: Tensor) -> Tensor:
        return self.lm_head(h)

    def save_pretrained(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("save_pretrained: a model wrapped by from_hf is saved with transformers, "
                        "wrapped.hf_model.save_pretrained(path)")


def _sliding_window(cfg: Any) -> int | None:
    window = getattr(cfg, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None:
        return int(window) if "sliding_attention" in layer_types else None
    if hasattr(cfg, "use_sliding_window"):  # Qwen2 without layer_types
        return int(window) if cfg.use_sliding_window else None
    return int(window)  # Mistral: a set sliding_window is always used


def from_hf(hf_model: nn.Module, *, mask_token_id: int | None = None, block_size: int = 32,
            sub_block_size: int | None = None, shift_logits: bool = False, eos_token_id: int | None = None,
            family: str | None = None) -> HFBlockDiffusionLM:
    """Wrap a transformers ``Qwen2ForCausalLM`` / ``LlamaForCausalLM`` / ``MistralForCausalLM`` (any
    size, dtype, device, attention implementation) without copying its weights. See the module doc for
    the arguments' defaults. Every argument and every value read from ``hf_model.config`` is checked
    (``ModelConfig``): e.g. an eos id outside the vocabulary is an error naming ``eos_token_id``."""
    classes = _supported_classes()
    kind = next((name for name, cls in classes.items() if isinstance(hf_model, cls)), None)
    if kind is None:
        raise TypeError(f"hf_model: expected one of {list(_SUPPORTED)} (or a subclass), "
                        f"got {type(hf_model).__name__}")
    cfg = hf_model.config
    cfg = getattr(cfg, "get_text_config", lambda: cfg)()
    inner = hf_model.model
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    hf_layers = list(inner.layers)
    q_out = hf_layers[0].self_attn.q_proj.out_features if hf_layers else heads * head_dim
    if q_out != heads * head_dim:
        raise ValueError(f"hf_model: q_proj has {q_out} outputs, expected num_attention_heads * head_dim = "
                         f"{heads} * {head_dim}")

    if family is None:
        family = FAST_DLLM_V2 if kind == "Qwen2ForCausalLM" else NLD
    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")
    vocab = int(cfg.vocab_size)
    if mask_token_id is None:
        mask_token_id = vocab - 1
    if eos_token_id is None:
        eos = getattr(cfg, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        eos_token_id = -1 if eos is None else int(eos)
    max_positions = int(getattr(cfg, "max_position_embeddings", None) or 32768)
    window = _sliding_window(cfg)
    if window is not None:
        max_positions = min(max_positions, window)
    dtype = inner.embed_tokens.weight.dtype
    if dtype not in _DTYPES:
        raise TypeError(f"hf_model: parameters must be float32, float16 or bfloat16, got {dtype}")
    rope_params = getattr(cfg, "rope_parameters", None) or {}
    theta = getattr(cfg, "rope_theta", None) or rope_params.get("rope_theta", 10000.0)

    config = ModelConfig(
        family=family, num_layers=len(hf_layers), hidden_size=int(cfg.hidden_size), num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=int(cfg.intermediate_size),
        vocab_size=vocab, mask_token_id=mask_token_id, eos_token_id=eos_token_id,
        bos_token_id=getattr(cfg, "bos_token_id", None), pad_token_id=getattr(cfg, "pad_token_id", None),
        rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)), rope_theta=float(theta),
        rope_scaling=None,  # RoPE is transformers' own rotary_emb; this field is unused here
        llama4_scaling_beta=None, attention_bias=bool(getattr(cfg, "attention_bias", kind == "Qwen2ForCausalLM")),
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        max_position_embeddings=max_positions, block_size=block_size, sub_block_size=sub_block_size,
        shift_logits=shift_logits, initializer_range=float(getattr(cfg, "initializer_range", 0.02)),
        dtype=dtype, extra={"hf_class": type(hf_model).__name__, "sliding_window": window},
    )
    layers = nn.ModuleList(
        DecoderLayer(self_attn=layer.self_attn, mlp=layer.mlp, input_layernorm=layer.input_layernorm,
                     post_attention_layernorm=layer.post_attention_layernorm, num_heads=heads,
                     num_kv_heads=kv_heads, head_dim=head_dim)
        for layer in hf_layers)
    for ours, layer in zip(layers, hf_layers):
        ours.scale = float(getattr(layer.self_attn, "scaling", ours.scale))
    backbone = _HFBackbone(inner.embed_tokens, layers, inner.norm)
    wrapped = HFBlockDiffusionLM(config, backbone, hf_model.lm_head, _HFRotary(inner.rotary_emb), hf_model)
    wrapped.name_or_path = getattr(cfg, "_name_or_path", "") or type(hf_model).__name__
    wrapped.tokenizer = None
    return wrapped
