"""Value checks of a model configuration: every field's type, range and finiteness.

``validate_config(values, name)`` checks a mapping of ``ModelConfig`` field names to values and raises a
one-line ``ValueError`` naming the field (``name(field)``: config.json's key when the values come from a
checkpoint) and what was expected. ``ModelConfig`` runs it on construction, so presets with overrides,
``from_hf`` wrappers and loaded checkpoints are all checked the same way.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch

# float64: a model built for exact comparisons (training's decode-consistency check); a checkpoint's
# config.json names one of the other three (config_json.DTYPE_NAMES).
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
POSITIVE_INT_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                       "vocab_size", "block_size", "max_position_embeddings", "llama4_original_max_position")
BOOL_FIELDS = ("attention_bias", "tie_word_embeddings", "shift_logits")
# YaRN keys the rotary embedding implements (transformers' names); any other key is refused rather than
# silently ignored.
YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
             "attention_factor", "truncate")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_positive_int(name: str, value: Any) -> None:
    if not is_int(value) or value <= 0:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")


def check_token_id(name: str, value: Any, vocab_size: int, *, optional: bool = False,
                   never: bool = False) -> None:
    """An id in [0, vocab_size); ``optional``: None allowed; ``never``: -1 allowed (a token that never occurs)."""
    if value is None and optional:
        return
    if never and value == -1 and is_int(value):
        return
    if not is_int(value) or not 0 <= value < vocab_size:
        extra = " or None" if optional else (" or -1 (never)" if never else "")
        raise ValueError(f"{name}: expected a token id in [0, vocab_size={vocab_size}){extra}, got {value!r}")


def check_number(name: str, value: Any, *, above: float | None = None, at_least: float | None = None,
                 optional: bool = False) -> None:
    """A finite int or float, strictly above ``above`` / at least ``at_least``; ``optional``: None allowed."""
    if value is None and optional:
        return
    bound = f" > {above:g}" if above is not None else (f" >= {at_least:g}" if at_least is not None else "")
    ok = is_number(value) and (above is None or value > above) and (at_least is None or value >= at_least)
    if not ok:
        raise ValueError(f"{name}: expected a finite number{bound}{' or None' if optional else ''}, got {value!r}")


def check_rope_scaling(name: str, scaling: Any) -> None:
    """None, or YaRN parameters: ``factor`` >= 1 and ``original_max_position_embeddings`` required."""
    if scaling is None:
        return
    if not isinstance(scaling, dict):
        raise ValueError(f"{name}: expected None or a dict of YaRN parameters, got {type(scaling).__name__}")
    unknown = sorted(set(scaling) - set(YARN_KEYS))
    if unknown:
        raise ValueError(f"{name}: unsupported YaRN parameter(s) {unknown}; supported: {list(YARN_KEYS)}")
    for key in ("factor", "original_max_position_embeddings"):
        if key not in scaling:
            raise ValueError(f"{name}: YaRN needs {key!r}")
    check_number(f"{name}.factor", scaling["factor"], at_least=1.0)
    check_positive_int(f"{name}.original_max_position_embeddings", scaling["original_max_position_embeddings"])
    for key in ("beta_fast", "beta_slow"):
        if key in scaling:
            check_number(f"{name}.{key}", scaling[key], above=0.0)
    for key in ("mscale", "mscale_all_dim"):
        check_number(f"{name}.{key}", scaling.get(key), at_least=0.0, optional=True)
    check_number(f"{name}.attention_factor", scaling.get("attention_factor"), above=0.0, optional=True)
    if scaling.get("truncate", True) is not True:  # the rotary embedding rounds the ramp bounds (truncate)
        raise ValueError(f"{name}.truncate: only true (rounded correction range) is implemented, "
                         f"got {scaling['truncate']!r}")


def validate_config(values: Mapping[str, Any], name: Callable[[str], str] = str) -> None:
    """Check every field of a configuration (see the module docstring)."""
    for field in POSITIVE_INT_FIELDS:
        check_positive_int(name(field), values[field])
    if values["head_dim"] % 2:
        raise ValueError(f"{name('head_dim')}: expected an even int (RoPE rotates pairs), got {values['head_dim']}")
    if values["num_heads"] % values["num_kv_heads"]:
        raise ValueError(f"{name('num_heads')}: expected a multiple of num_kv_heads={values['num_kv_heads']}, "
                         f"got {values['num_heads']}")
    block, sub = values["block_size"], values["sub_block_size"]
    if block < 2:
        raise ValueError(f"{name('block_size')}: expected an int >= 2 (position 0 and a masked one), got {block}")
    if sub is not None and (not is_int(sub) or sub <= 0 or block % sub):
        raise ValueError(f"{name('sub_block_size')}: expected None or a divisor of block_size={block}, got {sub!r}")
    vocab = values["vocab_size"]
    check_token_id(name("mask_token_id"), values["mask_token_id"], vocab)
    check_token_id(name("eos_token_id"), values["eos_token_id"], vocab, never=True)
    if values["eos_token_id"] == values["mask_token_id"]:
        raise ValueError(f"{name('eos_token_id')}: expected an id other than mask_token_id, "
                         f"got {values['eos_token_id']} for both")
    for field in ("bos_token_id", "pad_token_id"):
        check_token_id(name(field), values[field], vocab, optional=True)
    check_number(name("rms_norm_eps"), values["rms_norm_eps"], above=0.0)
    check_number(name("rope_theta"), values["rope_theta"], above=1.0)
    check_rope_scaling(name("rope_scaling"), values["rope_scaling"])
    check_number(name("llama4_scaling_beta"), values["llama4_scaling_beta"], at_least=0.0, optional=True)
    check_number(name("initializer_range"), values["initializer_range"], at_least=0.0)
    for field in BOOL_FIELDS:
        if not isinstance(values[field], bool):
            raise ValueError(f"{name(field)}: expected true or false, got {values[field]!r}")
    if values["dtype"] not in DTYPES:
        raise ValueError(f"{name('dtype')}: expected one of float32, float16, bfloat16, float64, got {values['dtype']!r}")
    if not isinstance(values["extra"], dict):
        raise ValueError(f"{name('extra')}: expected a dict, got {type(values['extra']).__name__}")
