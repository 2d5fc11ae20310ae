"""Checkpoint directories: save/load round trips, sharding, tokenizer, config.json, load errors."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specfold_compile.models import build, from_pretrained
from specfold_compile.models.checkpoint import INDEX_FILE, SINGLE_FILE

ARCH = {"tiny-fast-dllm-v2": "Fast_dLLM_QwenForCausalLM", "tiny-nld": "NemotronLabsDiffusionModel"}
PREFIX = {"tiny-fast-dllm-v2": "model", "tiny-nld": "encoder"}
HEAD = {"tiny-fast-dllm-v2": "lm_head.weight", "tiny-nld": "diffusion_head.weight"}


def _stored_names(path) -> set[str]:
    if (path / INDEX_FILE).is_file():
        return set(json.loads((path / INDEX_FILE).read_text())["weight_map"])
    return set(load_file(str(path / SINGLE_FILE)))


def _assert_same(a, b, prompt_len=70):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype, name
        assert torch.equal(sa[name], sb[name]), name
    assert a.config == b.config
    cfg = a.config
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=gen)
    tokens = torch.randint(0, cfg.vocab_size, (3, cfg.block_size), generator=gen)
    parents = torch.tensor([-1, 0, 1])
    ca, cb = a.prefill(prompt), b.prefill(prompt)
    assert torch.equal(ca.next_logits, cb.next_logits)
    with torch.no_grad():
        assert torch.equal(a(tokens, parents, ca), b(tokens, parents, cb))


# NLD's diffusion_head is always untied; Fast-dLLM v2 ties its head in the 1.5B, not in the 7B.
@pytest.mark.parametrize("preset,tied", [("tiny-fast-dllm-v2", True), ("tiny-fast-dllm-v2", False),
                                         ("tiny-nld", False)])
def test_round_trip(tmp_path, preset, tied):
    model = build(preset, seed=5, tie_word_embeddings=tied, attention_bias=True)
    model.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == [ARCH[preset]]
    names = _stored_names(tmp_path)
    pre = PREFIX[preset]
    for expected in (f"{pre}.layers.0.self_attn.q_proj.weight", f"{pre}.layers.0.self_attn.q_proj.bias",
                     f"{pre}.layers.1.mlp.down_proj.weight", f"{pre}.embed_tokens.weight", f"{pre}.norm.weight",
                     f"{pre}.layers.0.input_layernorm.weight", f"{pre}.layers.0.post_attention_layernorm.weight"):
        assert expected in names
    assert (HEAD[preset] in names) == (not tied)
    if preset == "tiny-fast-dllm-v2":
        assert raw["bd_size"] == model.config.block_size
    loaded = from_pretrained(tmp_path)
    assert loaded.tokenizer is None
    _assert_same(model, loaded)


@pytest.mark.parametrize("preset", list(ARCH))
def test_sharded_round_trip_with_tokenizer(tmp_path, preset):
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = build(preset, seed=7, tie_word_embeddings=False, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path, max_shard_bytes=20_000)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and all((tmp_path / s).is_file() for s in shards)
    assert not (tmp_path / SINGLE_FILE).exists()
    assert set(index["weight_map"]) == set(model.state_dict())

    vocab = {f"w{i}": i for i in range(model.config.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))

    loaded = from_pretrained(tmp_path)
    assert loaded.config.dtype == torch.bfloat16
    _assert_same(model, loaded)
    assert loaded.tokenizer.encode("w3 w17 w5").ids == [3, 17, 5]
    # a dtype override converts on load
    as_f32 = from_pretrained(tmp_path, dtype=torch.float32)
    assert as_f32.embed_tokens.weight.dtype == torch.float32
    assert torch.equal(as_f32.embed_tokens.weight, model.embed_tokens.weight.float())


def test_tied_checkpoint_storing_the_head_loads(tmp_path):
    model = build("tiny-fast-dllm-v2", seed=2)  # tied
    model.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / SINGLE_FILE))
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(tmp_path / SINGLE_FILE))
    _assert_same(model, from_pretrained(tmp_path), prompt_len=5)


def _edit_weights(path, fn):
    state = load_file(str(path / SINGLE_FILE))
    fn(state)
    save_file(state, str(path / SINGLE_FILE))


@pytest.mark.parametrize("preset", list(ARCH))
def test_load_errors_name_the_tensor(tmp_path, preset):
    model = build(preset, seed=0)
    pre = PREFIX[preset]
    model.save_pretrained(tmp_path)
    name = f"{pre}.layers.1.mlp.up_proj.weight"

    _edit_weights(tmp_path, lambda s: s.pop(name))
    with pytest.raises(ValueError, match=r"missing.*" + name.replace(".", r"\.")):
        from_pretrained(tmp_path)

    model.save_pretrained(tmp_path)
    _edit_weights(tmp_path, lambda s: s.__setitem__(f"{pre}.layers.0.extra.weight", torch.zeros(2)))
    with pytest.raises(ValueError, match=r"unexpected.*extra\.weight"):
        from_pretrained(tmp_path)

    model.save_pretrained(tmp_path)
    _edit_weights(tmp_path, lambda s: s.__setitem__(name, s[name][:-1].clone()))
    with pytest.raises(ValueError, match=name.replace(".", r"\.") + r".*shape"):
        from_pretrained(tmp_path)


def test_unknown_architecture_and_missing_files(tmp_path):
    model = build("tiny-nld", seed=0)
    model.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="architectures"):
        from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(tmp_path / "nowhere")
    raw["architectures"] = ["NemotronLabsDiffusionForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / SINGLE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize("preset", list(ARCH))
def test_config_json_round_trip(tmp_path, preset):
    """Every field of the config survives config.json (YaRN, Llama-4 scaling, sub-block, ...)."""
    model = build(preset, seed=0, num_layers=1, rope_theta=12345.0, rms_norm_eps=3e-6)
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path)
    assert loaded.config == model.config
