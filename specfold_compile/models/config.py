"""Model configuration: one dataclass for both families, named presets, and config.json translation.

Every value of a real checkpoint is read from its config.json (SPEC.md section 5); the presets below
only mirror those files so random-weight models of the real shapes can be built without them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

FAST_DLLM_V2 = "fast-dllm-v2"
NLD = "nld"
FAMILIES = (FAST_DLLM_V2, NLD)

FAST_DLLM_ARCHITECTURE = "Fast_dLLM_QwenForCausalLM"
NLD_ARCHITECTURE = "NemotronLabsDiffusionForCausalLM"


@dataclass(frozen=True)
class DecodingRules:
    """What a family's reference ``generate`` does that ``decoding.generate`` reproduces (REFERENCES.md).

    ``prompt_on_block_grid``: blocks sit on the absolute grid ``[kB, kB + B)`` from the first prompt token;
    the prompt's whole blocks are prefilled in one block-causal pass and its last ``L mod B`` tokens open
    the first decoded block, fixed (Fast-dLLM v2). Otherwise the whole prompt is prefilled causally and
    the first block starts right after it with the prefill's seed (NLD).
    ``threshold_inclusive``: commit where ``p >= threshold`` (NLD) rather than ``p > threshold``.
    ``argmax_of_probs``: the committed token is the argmax of the softmax in the model's dtype, where
    rounding can tie (Fast-dLLM v2), rather than of the logits (NLD); read under
    ``confidence_dtype="model"`` only.
    """

    prompt_on_block_grid: bool
    threshold_inclusive: bool
    argmax_of_probs: bool


FAMILY_DECODING_RULES = {
    FAST_DLLM_V2: DecodingRules(prompt_on_block_grid=True, threshold_inclusive=False, argmax_of_probs=True),
    NLD: DecodingRules(prompt_on_block_grid=False, threshold_inclusive=True, argmax_of_probs=False),
}


@dataclass
class ModelConfig:
    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    mask_token_id: int
    eos_token_id: int
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    # YaRN parameters ({"factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
    # "mscale", "mscale_all_dim"}) or None for plain RoPE.
    rope_scaling: dict | None = None
    # Llama-4 style query scaling 1 + beta * log(1 + floor(pos / original_max)); None disables it.
    llama4_scaling_beta: float | None = None
    llama4_original_max_position: int = 16384
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    block_size: int = 32
    # Fast-dLLM v2 commits only inside the current sub-block; None = anywhere in the block (NLD).
    sub_block_size: int | None = None
    # Fast-dLLM v2 reads position p's distribution from position p-1 (position 0 reads its own).
    shift_logits: bool = False
    initializer_range: float = 0.02
    dtype: torch.dtype = torch.float32
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family: expected one of {FAMILIES}, got {self.family!r}")
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                     "vocab_size", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads: expected a multiple of num_kv_heads={self.num_kv_heads}, got {self.num_heads}")
        if self.sub_block_size is not None and (self.sub_block_size <= 0 or self.block_size % self.sub_block_size):
            raise ValueError(f"sub_block_size: expected a divisor of block_size={self.block_size}, got {self.sub_block_size}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id: expected an id below vocab_size={self.vocab_size}, got {self.mask_token_id}")
        if isinstance(self.dtype, str):
            self.dtype = getattr(torch, self.dtype)

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def decoding_rules(self) -> DecodingRules:
        """The family's reference decoding conventions (``DecodingRules``)."""
        return FAMILY_DECODING_RULES[self.family]

    def packed_linear_shapes(self, fused: bool = True) -> list[tuple[int, int]]:
        """(out, in) of the linears of one decoder layer that folding runs on computed rows only: q/k/v
        (pre-attention) and gate/up, down (MLP), as the models are built (``fused``: q/k/v as one, gate/up
        as one; else each part). o_proj reads each row's own attention output, so it runs on every row."""
        h, q, kv, f = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, \
            self.intermediate_size
        if fused:
            return [(q + 2 * kv, h), (2 * f, h), (h, f)]
        return [(q, h), (kv, h), (kv, h), (f, h), (f, h), (h, f)]

    def replace(self, **overrides: Any) -> "ModelConfig":
        valid = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - valid)
        if unknown:
            raise TypeError(f"unknown config override(s) {unknown}; valid: {sorted(valid)}")
        return dataclasses.replace(self, **overrides)


_NLD_YARN = {"factor": 16.0, "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
             "mscale": 1.0, "mscale_all_dim": 1.0}


def _fast(**kw: Any) -> ModelConfig:
    base = dict(family=FAST_DLLM_V2, mask_token_id=151665, eos_token_id=151645, bos_token_id=151643,
                rms_norm_eps=1e-6, rope_theta=1e6, attention_bias=True, sub_block_size=8, shift_logits=True,
                max_position_embeddings=32768, head_dim=128)
    base.update(kw)
    return ModelConfig(**base)


def _nld(**kw: Any) -> ModelConfig:
    base = dict(family=NLD, mask_token_id=100, eos_token_id=11, bos_token_id=1, pad_token_id=11,
                rms_norm_eps=1e-5, rope_theta=1e6, rope_scaling=dict(_NLD_YARN), llama4_scaling_beta=0.1,
                llama4_original_max_position=16384, attention_bias=False, tie_word_embeddings=False,
                sub_block_size=None, shift_logits=False, max_position_embeddings=262144, head_dim=128,
                num_heads=32, num_kv_heads=8, vocab_size=131072)
    base.update(kw)
    return ModelConfig(**base)


PRESETS: dict[str, ModelConfig] = {
    "fast-dllm-v2-1.5b": _fast(num_layers=28, hidden_size=1536, num_heads=12, num_kv_heads=2,
                               intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True),
    "fast-dllm-v2-7b": _fast(num_layers=28, hidden_size=3584, num_heads=28, num_kv_heads=4,
                             intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
    "nld-3b": _nld(num_layers=26, hidden_size=3072, intermediate_size=9216),
    "nld-8b": _nld(num_layers=34, hidden_size=4096, intermediate_size=14336),
    "nld-14b": _nld(num_layers=40, hidden_size=5120, intermediate_size=16384, rope_theta=1e9),
    # Tiny models for tests and demos: head_dim deliberately differs from hidden/heads, GQA on.
    "tiny-fast-dllm-v2": _fast(num_layers=2, hidden_size=48, num_heads=4, num_kv_heads=2, head_dim=16,
                               intermediate_size=96, vocab_size=128, mask_token_id=127, eos_token_id=1,
                               bos_token_id=0, block_size=16, sub_block_size=8, tie_word_embeddings=True,
                               max_position_embeddings=4096, initializer_range=0.25),
    "tiny-nld": _nld(num_layers=2, hidden_size=48, num_heads=4, num_kv_heads=2, head_dim=16,
                     intermediate_size=96, vocab_size=128, mask_token_id=100, eos_token_id=11, bos_token_id=1,
                     block_size=16, max_position_embeddings=4096, llama4_original_max_position=64,
                     rope_scaling=dict(_NLD_YARN, original_max_position_embeddings=64), initializer_range=0.25),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"name: unknown preset {name!r}; presets: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)


# --- config.json translation -------------------------------------------------------------------

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def to_hf_dict(cfg: ModelConfig) -> dict[str, Any]:
    """The config.json of a checkpoint in the family's layout."""
    common = {
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps, "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings, "torch_dtype": _DTYPE_NAMES[cfg.dtype],
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
        "mask_token_id": cfg.mask_token_id, "initializer_range": cfg.initializer_range,
        "hidden_act": "silu",
    }
    if cfg.family == FAST_DLLM_V2:
        return {"architectures": [FAST_DLLM_ARCHITECTURE], "model_type": "Fast_dLLM_Qwen",
                "rope_theta": cfg.rope_theta, "attention_bias": cfg.attention_bias, "bd_size": cfg.block_size,
                "small_block_size": cfg.sub_block_size, **common}
    rope = {"rope_type": "yarn" if cfg.rope_scaling else "default", "rope_theta": cfg.rope_theta,
            **(cfg.rope_scaling or {})}
    if cfg.llama4_scaling_beta is not None:
        rope["llama_4_scaling_beta"] = cfg.llama4_scaling_beta
        rope.setdefault("original_max_position_embeddings", cfg.llama4_original_max_position)
        if rope["original_max_position_embeddings"] != cfg.llama4_original_max_position:
            # Real NLD configs share one value; keep a differing one under its own key.
            rope["llama_4_original_max_position_embeddings"] = cfg.llama4_original_max_position
    return {"architectures": [NLD_ARCHITECTURE], "model_type": "nemotron_labs_diffusion",
            "rope_parameters": rope, "attention_bias": cfg.attention_bias, "block_size": cfg.block_size, **common}


def family_of_architectures(architectures: list[str] | None) -> str:
    names = list(architectures or [])
    if any(a.startswith("Fast_dLLM") for a in names):
        return FAST_DLLM_V2
    if any("Diffusion" in a and ("Nemotron" in a or "NLD" in a) for a in names):
        return NLD
    raise ValueError(f"architectures: unknown architecture {names}; supported: "
                     f"[{FAST_DLLM_ARCHITECTURE!r}, {NLD_ARCHITECTURE!r} (or another Nemotron*Diffusion* name)]")


def _require(d: dict, key: str) -> Any:
    if key not in d:
        raise ValueError(f"config.json: missing required key {key!r}")
    return d[key]


def from_hf_dict(raw: dict[str, Any], **overrides: Any) -> ModelConfig:
    """Build a ModelConfig from a checkpoint's config.json (flat, or with a nested text_config)."""
    family = family_of_architectures(raw.get("architectures"))
    d = dict(raw.get("text_config") or {}, **{k: v for k, v in raw.items() if k != "text_config"})
    heads = _require(d, "num_attention_heads")
    # head_dim is read when present; transformers' Qwen2 configs omit it and mean hidden / heads.
    head_dim = d.get("head_dim") or _require(d, "hidden_size") // heads
    eos = d.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    kw: dict[str, Any] = dict(
        family=family, num_layers=_require(d, "num_hidden_layers"), hidden_size=_require(d, "hidden_size"),
        num_heads=heads, num_kv_heads=d.get("num_key_value_heads") or heads, head_dim=head_dim,
        intermediate_size=_require(d, "intermediate_size"), vocab_size=_require(d, "vocab_size"),
        bos_token_id=d.get("bos_token_id"), pad_token_id=d.get("pad_token_id"),
        max_position_embeddings=d.get("max_position_embeddings", 32768),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        initializer_range=d.get("initializer_range", 0.02),
    )
    dtype_name = d.get("torch_dtype") or d.get("dtype")
    if dtype_name in ("float32", "float16", "bfloat16"):
        kw["dtype"] = getattr(torch, dtype_name)
    if family == FAST_DLLM_V2:
        kw.update(mask_token_id=d.get("mask_token_id", 151665), eos_token_id=eos if eos is not None else 151645,
                  rms_norm_eps=d.get("rms_norm_eps", 1e-6), rope_theta=d.get("rope_theta", 1e6),
                  attention_bias=d.get("attention_bias", True), block_size=d.get("bd_size", 32),
                  sub_block_size=d.get("small_block_size", 8), shift_logits=True)
    else:
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", d.get("rope_theta", 1e6))
        rope_type = rope.pop("rope_type", rope.pop("type", "default"))
        beta = rope.pop("llama_4_scaling_beta", None)
        rope.pop("max_position_embeddings", None)
        orig = rope.pop("llama_4_original_max_position_embeddings", rope.get("original_max_position_embeddings", 16384))
        kw.update(mask_token_id=d.get("mask_token_id", 100), eos_token_id=eos if eos is not None else 11,
                  rms_norm_eps=d.get("rms_norm_eps", 1e-5), rope_theta=theta,
                  rope_scaling=rope if rope_type == "yarn" else None, llama4_scaling_beta=beta,
                  llama4_original_max_position=orig, attention_bias=d.get("attention_bias", False),
                  block_size=d.get("block_size", 32), sub_block_size=None, shift_logits=False)
    kw.update(overrides)
    return ModelConfig(**kw)
