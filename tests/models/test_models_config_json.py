"""config.json reading: every value checked, missing keys named, the real families' files accepted."""
from __future__ import annotations

import json
import math
import re
import warnings

import pytest
import torch

from specfold_compile.models import build, from_pretrained
from specfold_compile.models.config import preset
from specfold_compile.models.config_json import from_hf_dict, to_hf_dict

# Fast-dLLM v2's real config.json omits two keys on purpose (see FAST_1P5B); _read records the warnings.
pytestmark = pytest.mark.filterwarnings("ignore:config.json. no ")

# The shapes of the published checkpoints' config.json (docs/SPEC.md section 5): Fast-dLLM v2 keeps Qwen2.5's
# keys plus bd_size (mask id, sub-block and stop token are arguments of the authors' generate);
# NLD's holds its block size, mask id and YaRN / Llama-4 rope parameters.
FAST_1P5B = {
    "architectures": ["Fast_dLLM_QwenForCausalLM"], "model_type": "Fast_dLLM_Qwen", "bd_size": 32,
    "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 1536,
    "initializer_range": 0.02, "intermediate_size": 8960, "max_position_embeddings": 32768,
    "max_window_layers": 21, "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}
NLD_3B = {
    "architectures": ["NemotronLabsDiffusionModel"], "model_type": "nemotron_labs_diffusion",
    "attention_bias": False, "block_size": 32, "bos_token_id": 1, "eos_token_id": 11, "pad_token_id": 11,
    "dlm_paradigm": "bidirectional", "head_dim": 128, "hidden_act": "silu", "hidden_size": 3072,
    "intermediate_size": 9216, "mask_token_id": 100, "max_position_embeddings": 262144,
    "num_attention_heads": 32, "num_hidden_layers": 26, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 16.0, "llama_4_scaling_beta": 0.1,
                        "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 16384,
                        "rope_theta": 1000000.0, "rope_type": "yarn"},
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 131072,
}


def _read(raw, **overrides):
    """from_hf_dict, returning (config, warning messages)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = from_hf_dict(raw, **overrides)
    return cfg, [str(w.message) for w in caught]


def test_real_fast_dllm_config_reads_with_the_reference_defaults_named():
    cfg, warned = _read(FAST_1P5B)
    assert cfg == preset("fast-dllm-v2-1.5b", dtype=torch.bfloat16)
    assert len(warned) == 2
    assert any("'mask_token_id'" in w and "151665" in w for w in warned)
    assert any("'small_block_size'" in w and "8" in w for w in warned)


def test_real_nld_config_reads_without_warnings():
    cfg, warned = _read(NLD_3B)
    assert warned == []
    assert cfg == preset("nld-3b", dtype=torch.bfloat16)


@pytest.mark.parametrize("name", ["tiny-fast-dllm-v2", "tiny-nld"])
def test_saved_config_round_trips_silently(name):
    cfg = preset(name)
    back, warned = _read(json.loads(json.dumps(to_hf_dict(cfg))))
    assert back == cfg and warned == []


def _without(raw, *keys):
    return {k: v for k, v in raw.items() if k not in keys}


@pytest.mark.parametrize("raw,key", [
    (_without(FAST_1P5B, "bd_size"), "bd_size"),
    (_without(FAST_1P5B, "num_hidden_layers"), "num_hidden_layers"),
    (_without(FAST_1P5B, "vocab_size"), "vocab_size"),
    (_without(NLD_3B, "block_size"), "block_size"),
    (_without(NLD_3B, "mask_token_id"), "mask_token_id"),
    (_without(NLD_3B, "eos_token_id"), "eos_token_id"),
    (_without(NLD_3B, "intermediate_size"), "intermediate_size"),
])
def test_missing_structural_key_is_named(raw, key):
    with pytest.raises(ValueError, match=rf"^config\.json: missing required key '{key}'$"):
        from_hf_dict(raw)


def test_missing_block_size_of_a_saved_checkpoint_is_an_error_not_32(tmp_path):
    """A checkpoint saved with block 16 never loads as the default 32."""
    model = build("tiny-fast-dllm-v2", seed=0)
    assert model.config.block_size == 16
    model.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    del raw["bd_size"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="bd_size"):
        from_pretrained(tmp_path)


def test_defaulted_keys_warn_with_their_value():
    _, warned = _read(_without(FAST_1P5B, "rms_norm_eps", "rope_theta", "eos_token_id"))
    assert any("'rms_norm_eps'" in w and "1e-06" in w for w in warned)
    assert any("'rope_theta'" in w and "1000000.0" in w for w in warned)
    assert any("'eos_token_id'" in w and "151645" in w for w in warned)
    _, warned = _read(_without(NLD_3B, "max_position_embeddings"))
    assert len(warned) == 1 and "'max_position_embeddings'" in warned[0] and "262144" in warned[0]
    # an override replaces the key: nothing is missing
    _, warned = _read(_without(FAST_1P5B), mask_token_id=151665, sub_block_size=8)
    assert warned == []


def _with(raw, **changes):
    out = json.loads(json.dumps(raw))
    for key, value in changes.items():
        if "__" in key:
            outer, inner = key.split("__")
            out[outer][inner] = value
        else:
            out[key] = value
    return out


BAD_VALUES = [
    (FAST_1P5B, dict(rms_norm_eps=-1), r"rms_norm_eps: expected a finite number > 0"),
    (FAST_1P5B, dict(rms_norm_eps=0), r"rms_norm_eps"),
    (FAST_1P5B, dict(rms_norm_eps=math.nan), r"rms_norm_eps: expected a finite number"),
    (FAST_1P5B, dict(rms_norm_eps="1e-6"), r"rms_norm_eps"),
    (FAST_1P5B, dict(rope_theta=math.nan), r"rope_theta: expected a finite number > 1"),
    (FAST_1P5B, dict(rope_theta=math.inf), r"rope_theta"),
    (FAST_1P5B, dict(rope_theta=0), r"rope_theta"),
    (NLD_3B, dict(rope_parameters__rope_theta=math.nan), r"rope_parameters\.rope_theta"),
    (FAST_1P5B, dict(eos_token_id=151936), r"eos_token_id: expected a token id in \[0, vocab_size=151936\)"),
    (FAST_1P5B, dict(eos_token_id=-5), r"eos_token_id"),
    (FAST_1P5B, dict(eos_token_id=[151645, 10**7]), r"eos_token_id\[1\]"),
    (FAST_1P5B, dict(eos_token_id=[]), r"eos_token_id"),
    (FAST_1P5B, dict(eos_token_id=1.5), r"eos_token_id"),
    (FAST_1P5B, dict(bos_token_id=10**6), r"bos_token_id"),
    (NLD_3B, dict(pad_token_id=-1), r"pad_token_id"),
    (NLD_3B, dict(mask_token_id=131072), r"mask_token_id: expected a token id"),
    (FAST_1P5B, dict(mask_token_id=151645), r"eos_token_id: expected an id other than mask_token_id"),
    (FAST_1P5B, dict(num_hidden_layers=0), r"num_hidden_layers: expected a positive int"),
    (FAST_1P5B, dict(num_hidden_layers=2.5), r"num_hidden_layers"),
    (FAST_1P5B, dict(num_hidden_layers=True), r"num_hidden_layers"),
    (FAST_1P5B, dict(hidden_size="1536"), r"hidden_size"),
    (FAST_1P5B, dict(num_key_value_heads=5), r"num_attention_heads: expected a multiple of num_kv_heads=5"),
    (FAST_1P5B, dict(hidden_size=1537), r"head_dim: missing, and hidden_size=1537"),
    (NLD_3B, dict(head_dim=127), r"head_dim: expected an even int"),
    (FAST_1P5B, dict(bd_size=0), r"bd_size: expected a positive int"),
    (FAST_1P5B, dict(bd_size=1), r"bd_size: expected an int >= 2"),
    (FAST_1P5B, dict(small_block_size=5), r"small_block_size: expected None or a divisor of block_size=32"),
    (NLD_3B, dict(block_size=32.0), r"block_size"),
    (FAST_1P5B, dict(max_position_embeddings=-1), r"max_position_embeddings"),
    (FAST_1P5B, dict(tie_word_embeddings="yes"), r"tie_word_embeddings: expected true or false"),
    (NLD_3B, dict(attention_bias=1), r"attention_bias"),
    (FAST_1P5B, dict(initializer_range=math.nan), r"initializer_range"),
    (FAST_1P5B, dict(torch_dtype="float64"), r"torch_dtype: expected one of"),
    (FAST_1P5B, dict(hidden_act="gelu"), r"hidden_act: expected 'silu'"),
    (FAST_1P5B, dict(use_sliding_window=True), r"use_sliding_window"),
    (NLD_3B, dict(sliding_window=4096), r"sliding_window: expected null"),
    (NLD_3B, dict(layer_types=["sliding_attention"] * 26), r"layer_types"),
    (FAST_1P5B, dict(quantization_config={"bits": 4}), r"quantization_config"),
    (FAST_1P5B, dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), r"rope_scaling\.rope_type"),
    (FAST_1P5B, dict(rope_scaling={"rope_type": "default", "factor": 2.0}), r"no effect"),
    (NLD_3B, dict(rope_parameters__factor=0.5), r"rope_parameters\.factor: expected a finite number >= 1"),
    (NLD_3B, dict(rope_parameters__beta_fast=math.nan), r"rope_parameters\.beta_fast"),
    (NLD_3B, dict(rope_parameters__truncate=False), r"rope_parameters\.truncate"),
    (NLD_3B, dict(rope_parameters__partial_rotary_factor=0.5), r"unsupported YaRN parameter.*partial_rotary"),
    (NLD_3B, dict(rope_parameters__llama_4_scaling_beta=-1.0), r"llama_4_scaling_beta"),
    (NLD_3B, dict(rope_parameters="yarn"), r"rope_parameters: expected an object"),
    (NLD_3B, dict(architectures="NemotronLabsDiffusionModel"), r"architectures: expected a list"),
    (NLD_3B, dict(text_config=[1]), r"text_config"),
]


@pytest.mark.parametrize("raw,changes,match", BAD_VALUES)
def test_bad_value_is_one_line_naming_the_key(raw, changes, match):
    with pytest.raises(ValueError, match=r"^config\.json: ") as err:
        from_hf_dict(_with(raw, **changes))
    message = str(err.value)
    assert "\n" not in message
    assert re.search(match, message), message


def test_llama4_scaling_needs_its_original_length():
    raw = _with(NLD_3B)
    del raw["rope_parameters"]["original_max_position_embeddings"]
    raw["rope_parameters"]["rope_type"] = "default"
    for k in ("beta_fast", "beta_slow", "factor", "mscale", "mscale_all_dim"):
        del raw["rope_parameters"][k]
    with pytest.raises(ValueError, match="llama_4_scaling_beta needs original_max_position_embeddings"):
        from_hf_dict(raw)


def test_nld_loads_under_either_architecture_name(tmp_path):
    model = build("tiny-nld", seed=0)
    model.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["NemotronLabsDiffusionModel"]
    raw["architectures"] = ["NemotronLabsDiffusionForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert from_pretrained(tmp_path).config == model.config


def test_bad_config_files_are_one_line_errors(tmp_path):
    model = build("tiny-nld", seed=0)
    model.save_pretrained(tmp_path)
    text = (tmp_path / "config.json").read_text()
    (tmp_path / "config.json").write_text(text.replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": NaN'))
    with pytest.raises(ValueError, match=r"^config\.json: rms_norm_eps: expected a finite number > 0, got nan$"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(text[:-5])
    with pytest.raises(ValueError, match=r"^config\.json: file .*not valid JSON"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"^config\.json: file .*nested 100000 levels deep"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"^config\.json: expected a JSON object"):
        from_pretrained(tmp_path)


def test_corrupt_weights_and_missing_shards_are_named(tmp_path):
    model = build("tiny-fast-dllm-v2", seed=0)
    model.save_pretrained(tmp_path / "one")
    (tmp_path / "one" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=r"^checkpoint: cannot read model\.safetensors"):
        from_pretrained(tmp_path / "one")
    model.save_pretrained(tmp_path / "sharded", max_shard_bytes=20_000)
    shard = sorted((tmp_path / "sharded").glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=rf"shard\(s\) \['{shard.name}'\]"):
        from_pretrained(tmp_path / "sharded")


def test_model_config_checks_presets_and_overrides():
    """The same checks run on every ModelConfig, not only on config.json's."""
    for bad, match in [(dict(rms_norm_eps=-1.0), "rms_norm_eps"), (dict(rope_theta=math.nan), "rope_theta"),
                       (dict(eos_token_id=128), "eos_token_id"), (dict(bos_token_id=-3), "bos_token_id"),
                       (dict(dtype=torch.int64), "dtype"), (dict(shift_logits="no"), "shift_logits"),
                       (dict(llama4_scaling_beta=math.inf), "llama4_scaling_beta"),
                       (dict(rope_scaling={"factor": 2.0}), "original_max_position_embeddings")]:
        with pytest.raises(ValueError, match=rf"^{match}|^rope_scaling"):
            preset("tiny-nld", **bad)
    assert preset("tiny-nld", eos_token_id=-1).eos_token_id == -1  # a wrapped LM without eos never stops
    exact = preset("tiny-nld", dtype=torch.float64)  # for exact comparisons, but no checkpoint holds it
    with pytest.raises(ValueError, match="^dtype: a checkpoint holds one of"):
        to_hf_dict(exact)
