"""Presets: the docs/SPEC.md section 5 shapes on the meta device, overrides, unknown names."""
from __future__ import annotations

import pytest
import torch

from specfold_compile.models import PRESETS, build

# docs/SPEC.md section 5: layers, hidden, q heads, kv heads, FFN, vocab, mask id (head dim 128 everywhere)
SPEC_SHAPES = {
    "fast-dllm-v2-1.5b": (28, 1536, 12, 2, 8960, 151936, 151665),
    "fast-dllm-v2-7b": (28, 3584, 28, 4, 18944, 152064, 151665),
    "nld-3b": (26, 3072, 32, 8, 9216, 131072, 100),
    "nld-8b": (34, 4096, 32, 8, 14336, 131072, 100),
    "nld-14b": (40, 5120, 32, 8, 16384, 131072, 100),
}


@pytest.mark.parametrize("name", list(SPEC_SHAPES))
def test_big_presets_on_meta(name):
    layers, hidden, heads, kv, ffn, vocab, mask = SPEC_SHAPES[name]
    model = build(name, device="meta")
    tensors = list(model.parameters()) + list(model.buffers())
    assert tensors and all(t.is_meta for t in tensors), "meta build must allocate nothing"
    cfg = model.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
            cfg.intermediate_size, cfg.vocab_size, cfg.mask_token_id) == (layers, hidden, heads, kv, 128, ffn,
                                                                        vocab, mask)
    assert len(model.layers) == layers
    # Built with q/k/v and gate/up fused (the default); the state_dict keeps the checkpoint's part names.
    attn, mlp = model.layers[0].self_attn, model.layers[-1].mlp
    assert attn.qkv_proj.weight.shape == ((heads + 2 * kv) * 128, hidden)
    assert mlp.gate_up_proj.weight.shape == (2 * ffn, hidden)
    sd = model.state_dict()
    pre = "model" if name.startswith("fast") else "encoder"
    first, last = f"{pre}.layers.0.self_attn", f"{pre}.layers.{layers - 1}.mlp"
    assert sd[f"{first}.q_proj.weight"].shape == (heads * 128, hidden)
    assert sd[f"{first}.k_proj.weight"].shape == sd[f"{first}.v_proj.weight"].shape == (kv * 128, hidden)
    assert attn.o_proj.weight.shape == (hidden, heads * 128)
    assert sd[f"{last}.gate_proj.weight"].shape == sd[f"{last}.up_proj.weight"].shape == (ffn, hidden)
    assert mlp.down_proj.weight.shape == (hidden, ffn)
    assert model.embed_tokens.weight.shape == (vocab, hidden)
    names = set(sd)
    fast = name.startswith("fast")
    assert (f"{first}.q_proj.bias" in names) == fast and (f"{first}.k_proj.bias" in names) == fast
    assert cfg.block_size == 32
    if fast:
        assert cfg.shift_logits and cfg.sub_block_size == 8 and cfg.rope_theta == 1e6
        assert ("lm_head.weight" in names) == (name == "fast-dllm-v2-7b")  # the 1.5B ties its head
        assert "model.layers.0.self_attn.q_proj.bias" in names
    else:
        assert not cfg.shift_logits and cfg.sub_block_size is None and cfg.rope_scaling is not None
        assert cfg.eos_token_id == 11
        assert model.diffusion_head.weight.shape == (vocab, hidden)
        assert "encoder.layers.0.self_attn.q_proj.weight" in names and "diffusion_head.weight" in names
        assert cfg.rope_theta == (1e9 if name == "nld-14b" else 1e6)
    if name == "nld-14b":
        assert cfg.head_dim != cfg.hidden_size // cfg.num_heads


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_overrides_on_every_preset(name):
    model = build(name, device="meta", num_layers=1, vocab_size=256, mask_token_id=7, eos_token_id=8, bos_token_id=9,
                  dtype=torch.bfloat16)
    assert len(model.layers) == 1 and model.config.num_layers == 1
    assert model.embed_tokens.weight.shape[0] == 256 and model.config.mask_token_id == 7
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    assert PRESETS[name].num_layers != 1 or name.startswith("tiny")  # the preset itself is untouched
    with pytest.raises(TypeError, match="no_such_field"):
        build(name, device="meta", no_such_field=3)


def test_unknown_preset_and_bad_overrides():
    with pytest.raises(ValueError, match="name"):
        build("gpt-5", device="meta")
    with pytest.raises(ValueError, match="num_heads"):
        build("tiny-nld", num_heads=5, num_kv_heads=2)
    with pytest.raises(ValueError, match="mask_token_id"):
        build("tiny-nld", mask_token_id=128)
    with pytest.raises(ValueError, match="sub_block_size"):
        build("tiny-fast-dllm-v2", sub_block_size=5)
    with pytest.raises(ValueError, match="num_layers"):
        build("tiny-fast-dllm-v2", num_layers=0)


def test_seeded_builds():
    a, b, c = build("tiny-nld", seed=1), build("tiny-nld", seed=1), build("tiny-nld", seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.embed_tokens.weight, c.embed_tokens.weight)
