"""Model configuration: one dataclass for both families and named presets.

Every value of a real checkpoint is read from its config.json (``config_json.from_hf_dict``, docs/SPEC.md
section 5); the presets below only mirror those files so random-weight models of the real shapes can be
built without them. Every field is checked on construction (``config_checks.validate_config``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from .config_checks import validate_config

FAST_DLLM_V2 = "fast-dllm-v2"
NLD = "nld"
FAMILIES = (FAST_DLLM_V2, NLD)

FAST_DLLM_ARCHITECTURE = "Fast_dLLM_QwenForCausalLM"
# The real NLD checkpoints' name (written on save); checkpoints saved as ForCausalLM load too.
NLD_ARCHITECTURE = "NemotronLabsDiffusionModel"
NLD_ARCHITECTURES = (NLD_ARCHITECTURE, "NemotronLabsDiffusionForCausalLM")


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
    eos_token_id: int  # -1: never stops (from_hf on a causal LM without one)
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
        if isinstance(self.dtype, str):
            self.dtype = getattr(torch, self.dtype, self.dtype)
        validate_config(vars(self))

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
