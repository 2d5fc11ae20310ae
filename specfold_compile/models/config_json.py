"""config.json <-> ModelConfig, in each family's checkpoint layout (docs/SPEC.md section 5).

Reading (``from_hf_dict``) checks every value it uses; an error is one line naming config.json's key
and what was expected. A missing key that fixes the model's structure is an error: the shapes, the block
size (Fast-dLLM v2's ``bd_size``, NLD's ``block_size``), NLD's ``mask_token_id`` and ``eos_token_id``.
Where the family's published config.json leaves a value to its reference code instead, that code's value
is used and a warning names it: Fast-dLLM v2's ``mask_token_id`` (151665), ``small_block_size`` (8) and
stop token ``eos_token_id`` (151645), the defaults of the authors' ``generate``. A missing
``rms_norm_eps``, RoPE base or ``max_position_embeddings`` also takes the family's value with a warning.
Settings the models do not implement (another activation, sliding-window attention, a RoPE type other
than default / YaRN, quantized weights) are errors rather than ignored.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from .config import FAST_DLLM_ARCHITECTURE, FAST_DLLM_V2, NLD, NLD_ARCHITECTURE, NLD_ARCHITECTURES, ModelConfig
from .config_checks import check_positive_int, check_token_id, validate_config

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}

# ModelConfig field -> config.json key, where they differ (errors name the file's key).
_JSON_KEYS = {FAST_DLLM_V2: {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                             "num_kv_heads": "num_key_value_heads", "block_size": "bd_size",
                             "sub_block_size": "small_block_size", "dtype": "torch_dtype",
                             "rope_scaling": "rope_scaling"},
              NLD: {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                    "num_kv_heads": "num_key_value_heads", "dtype": "torch_dtype",
                    "rope_scaling": "rope_parameters", "rope_theta": "rope_parameters.rope_theta",
                    "llama4_scaling_beta": "rope_parameters.llama_4_scaling_beta",
                    "llama4_original_max_position": "rope_parameters.original_max_position_embeddings"}}

# Values the family's reference code fixes where its config.json may not say (used with a warning).
_FAMILY_DEFAULTS = {
    FAST_DLLM_V2: {"mask_token_id": 151665, "small_block_size": 8, "eos_token_id": 151645, "rms_norm_eps": 1e-6,
                   "rope_theta": 1e6, "max_position_embeddings": 32768},
    NLD: {"rms_norm_eps": 1e-5, "rope_theta": 1e6, "max_position_embeddings": 262144},
}
_FAMILY_NAMES = {FAST_DLLM_V2: "Fast-dLLM v2", NLD: "NLD"}
# ModelConfig's defaults, to check the fields read before the dataclass is built.
_FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.default is not dataclasses.MISSING}
_FIELD_DEFAULTS["extra"] = {}


def family_of_architectures(architectures: Any) -> str:
    if architectures is not None and (not isinstance(architectures, list)
                                      or not all(isinstance(a, str) for a in architectures)):
        raise ValueError(f"config.json: architectures: expected a list of names, got {architectures!r}")
    names = list(architectures or [])
    if any(a.startswith("Fast_dLLM") for a in names):
        return FAST_DLLM_V2
    if any(a in NLD_ARCHITECTURES or ("Diffusion" in a and ("Nemotron" in a or "NLD" in a)) for a in names):
        return NLD
    raise ValueError(f"config.json: architectures: unknown architecture {names}; supported: "
                     f"[{FAST_DLLM_ARCHITECTURE!r}, {NLD_ARCHITECTURE!r} (or another Nemotron*Diffusion* name)]")


def to_hf_dict(cfg: ModelConfig) -> dict[str, Any]:
    """The config.json of a checkpoint in the family's layout."""
    if cfg.dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype: a checkpoint holds one of {list(DTYPE_NAMES.values())}, got {cfg.dtype}")
    common = {
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps, "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings, "torch_dtype": DTYPE_NAMES[cfg.dtype],
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


class _Reader:
    """Looks keys up in a flattened config.json: required ones, ones the family defaults (with a warning),
    and optional ones; a key that an override replaces is never reported missing."""

    def __init__(self, d: dict, family: str, overrides: dict) -> None:
        self.d, self.family, self.overrides = d, family, overrides

    def required(self, key: str, field: str | None = None) -> Any:
        value = self.d.get(key)
        if value is None and (field or key) not in self.overrides:
            raise ValueError(f"config.json: missing required key {key!r}")
        return value

    def family_default(self, key: str, field: str | None = None) -> Any:
        value = self.d.get(key)
        if value is not None or (field or key) in self.overrides:
            return value
        default = _FAMILY_DEFAULTS[self.family][key]
        warnings.warn(f"config.json: no {key!r}; using {_FAMILY_NAMES[self.family]}'s default {default!r}",
                      stacklevel=4)
        return default

    def optional(self, key: str, default: Any) -> Any:
        value = self.d.get(key)
        return default if value is None else value


def _first_eos(name: str, eos: Any) -> Any:
    """eos_token_id may be a list (several stop tokens): decoding stops on the first."""
    if isinstance(eos, list):
        if not eos:
            raise ValueError(f"config.json: {name}: expected a token id or a non-empty list, got []")
        return eos[0]
    return eos


def _check_supported(d: dict, family: str, dtype_overridden: bool) -> None:
    act = d.get("hidden_act")
    if act is not None and act != "silu":
        raise ValueError(f"config.json: hidden_act: expected 'silu' (SwiGLU MLP), got {act!r}")
    if d.get("quantization_config") is not None:
        raise ValueError("config.json: quantization_config: quantized checkpoints are not supported")
    layer_types = d.get("layer_types")
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        raise ValueError(f"config.json: layer_types: expected only 'full_attention' (sliding-window attention "
                         f"is not implemented), got {sorted(set(layer_types))}")
    if family == FAST_DLLM_V2 and d.get("use_sliding_window"):
        raise ValueError("config.json: use_sliding_window: expected false (sliding-window attention is not implemented)")
    if family == NLD and d.get("sliding_window") is not None:
        raise ValueError(f"config.json: sliding_window: expected null (sliding-window attention is not implemented), "
                         f"got {d['sliding_window']!r}")
    dtype_name = d.get("torch_dtype") or d.get("dtype")
    if dtype_name is not None and not dtype_overridden and dtype_name not in DTYPE_NAMES.values():
        raise ValueError(f"config.json: torch_dtype: expected one of {list(DTYPE_NAMES.values())}, got {dtype_name!r}")


def _rope(r: _Reader) -> dict[str, Any]:
    """RoPE fields from ``rope_parameters`` (transformers 5, NLD) or ``rope_theta`` + ``rope_scaling``."""
    d = r.d
    key = "rope_parameters" if d.get("rope_parameters") is not None else "rope_scaling"
    params = d.get(key)
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"config.json: {key}: expected an object or null, got {params!r}")
    rope = dict(params or {})
    theta = rope.pop("rope_theta", None)
    if theta is None:
        theta = r.family_default("rope_theta")
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    if rope_type not in ("default", "yarn"):
        raise ValueError(f"config.json: {key}.rope_type: expected 'default' or 'yarn', got {rope_type!r}")
    beta = rope.pop("llama_4_scaling_beta", None)
    rope.pop("max_position_embeddings", None)
    orig = rope.pop("llama_4_original_max_position_embeddings", rope.get("original_max_position_embeddings"))
    if beta is not None and orig is None:
        raise ValueError(f"config.json: {key}: llama_4_scaling_beta needs original_max_position_embeddings")
    if rope_type == "default" and set(rope) - {"original_max_position_embeddings"}:
        raise ValueError(f"config.json: {key}: {sorted(rope)} have no effect with rope_type 'default'")
    return {"rope_theta": theta, "rope_scaling": rope if rope_type == "yarn" else None,
            "llama4_scaling_beta": beta, "llama4_original_max_position": 16384 if orig is None else orig}


def from_hf_dict(raw: dict[str, Any], **overrides: Any) -> ModelConfig:
    """Build a ModelConfig from a checkpoint's config.json (flat, or with a nested text_config); see the
    module docstring for what is checked."""
    if not isinstance(raw, dict):
        raise ValueError(f"config.json: expected a JSON object, got {type(raw).__name__}")
    family = family_of_architectures(raw.get("architectures"))
    text = raw.get("text_config") or {}
    if not isinstance(text, dict):
        raise ValueError(f"config.json: text_config: expected an object, got {type(text).__name__}")
    d = dict(text, **{k: v for k, v in raw.items() if k != "text_config"})
    _check_supported(d, family, "dtype" in overrides)
    r = _Reader(d, family, overrides)
    json_keys = _JSON_KEYS[family]

    def name(field: str) -> str:
        return f"config.json: {json_keys.get(field, field)}"

    heads, hidden = r.required("num_attention_heads", "num_heads"), r.required("hidden_size")
    check_positive_int(name("num_heads"), heads)
    check_positive_int(name("hidden_size"), hidden)
    head_dim = d.get("head_dim")
    if head_dim is None:  # transformers' Qwen2 configs omit it and mean hidden / heads
        if hidden % heads:
            raise ValueError(f"config.json: head_dim: missing, and hidden_size={hidden} is not a multiple of "
                             f"num_attention_heads={heads}")
        head_dim = hidden // heads
    eos = _first_eos("eos_token_id", r.required("eos_token_id") if family == NLD else r.family_default("eos_token_id"))
    kw: dict[str, Any] = dict(
        family=family, num_layers=r.required("num_hidden_layers", "num_layers"), hidden_size=hidden,
        num_heads=heads, num_kv_heads=r.optional("num_key_value_heads", heads), head_dim=head_dim,
        intermediate_size=r.required("intermediate_size"), vocab_size=r.required("vocab_size"),
        eos_token_id=eos, bos_token_id=d.get("bos_token_id"), pad_token_id=d.get("pad_token_id"),
        rms_norm_eps=r.family_default("rms_norm_eps"),
        max_position_embeddings=r.family_default("max_position_embeddings"),
        tie_word_embeddings=r.optional("tie_word_embeddings", False),
        initializer_range=r.optional("initializer_range", 0.02), **_rope(r),
    )
    dtype_name = d.get("torch_dtype") or d.get("dtype")
    if dtype_name is not None:
        kw["dtype"] = getattr(torch, dtype_name, None)
    if family == FAST_DLLM_V2:
        kw.update(mask_token_id=r.family_default("mask_token_id"), attention_bias=r.optional("attention_bias", True),
                  block_size=r.required("bd_size", "block_size"),
                  sub_block_size=r.family_default("small_block_size", "sub_block_size"), shift_logits=True)
    else:
        kw.update(mask_token_id=r.required("mask_token_id"), attention_bias=r.optional("attention_bias", False),
                  block_size=r.required("block_size"), sub_block_size=None, shift_logits=False)
    kw.update(overrides)
    validate_config({**_FIELD_DEFAULTS, **kw}, name)
    eos_all = d.get("eos_token_id")
    if isinstance(eos_all, list) and "eos_token_id" not in overrides:
        for i, other in enumerate(eos_all[1:], start=1):
            check_token_id(f"config.json: eos_token_id[{i}]", other, kw["vocab_size"])
    for field in ("rms_norm_eps", "rope_theta", "initializer_range", "llama4_scaling_beta"):
        if kw.get(field) is not None:  # JSON writes 1000000.0 as it likes; the dataclass holds floats
            kw[field] = float(kw[field])
    return ModelConfig(**kw)
