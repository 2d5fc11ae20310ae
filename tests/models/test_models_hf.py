"""from_hf: transformers Qwen2 / Llama / Mistral models wrapped into the BlockDiffusionLM interface."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from models_testutil import additive, assert_close, prefix_then_block_mask, random_tree  # noqa: E402
from specfold_compile.models import from_hf  # noqa: E402
from specfold_compile.reference import folded_verify  # noqa: E402

SMALL = dict(vocab_size=96, hidden_size=40, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, attn_implementation="eager")


def _qwen2(**kw):
    cfg = transformers.Qwen2Config(**{**SMALL, **kw})
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(cfg).eval()


def _llama(**kw):
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    cfg = transformers.LlamaConfig(**{**SMALL, "head_dim": 12, "rope_parameters": rope, **kw})
    torch.manual_seed(1)
    return transformers.LlamaForCausalLM(cfg).eval()


def _mistral(**kw):
    cfg = transformers.MistralConfig(**{**SMALL, "num_attention_heads": 8, "head_dim": 16, **kw})
    torch.manual_seed(2)
    return transformers.MistralForCausalLM(cfg).eval()


def _randomise(hf):
    """transformers initialises biases to zero and norms to one: make them random so they are tested."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen) if "norm" in name
                        else 0.5 * torch.randn(p.shape, generator=gen))
    return hf


MAKERS = {"qwen2": _qwen2, "llama": _llama, "mistral": _mistral}
_CACHE: dict = {}


def _pair(kind):
    if kind not in _CACHE:
        hf = _randomise(MAKERS[kind]())
        _CACHE[kind] = hf, from_hf(hf, block_size=8)
    return _CACHE[kind]


@pytest.mark.parametrize("kind", list(MAKERS))
def test_wrapper_reuses_modules_and_reads_the_config(kind):
    hf, model = _pair(kind)
    cfg = model.config
    hcfg = hf.config
    assert cfg.num_layers == hcfg.num_hidden_layers and cfg.hidden_size == hcfg.hidden_size
    assert (cfg.num_heads, cfg.num_kv_heads) == (hcfg.num_attention_heads, hcfg.num_key_value_heads)
    assert cfg.head_dim == (getattr(hcfg, "head_dim", None) or hcfg.hidden_size // hcfg.num_attention_heads)
    assert cfg.vocab_size == hcfg.vocab_size and cfg.mask_token_id == hcfg.vocab_size - 1
    assert cfg.block_size == 8 and cfg.sub_block_size is None and not cfg.shift_logits
    assert cfg.family == ("fast-dllm-v2" if kind == "qwen2" else "nld")
    # no copies: the wrapper's parameters are the HF model's, under the HF names
    hf_params = dict(hf.named_parameters())
    for name, p in model.named_parameters():
        assert p is hf_params[name], name
    assert model.layers[0].self_attn is hf.model.layers[0].self_attn
    assert model.hf_model is hf
    assert "model.layers.0.self_attn.q_proj.weight" in model.state_dict()


@pytest.mark.parametrize("kind", list(MAKERS))
def test_prefill_matches_hf(kind):
    hf, model = _pair(kind)
    gen = torch.Generator().manual_seed(4)
    for length in (1, 7, 50):  # llama3 rope scaling and the wrapper's rope tables over several lengths
        ids = torch.randint(0, hf.config.vocab_size, (length,), generator=gen)
        with torch.no_grad():
            ref = hf(ids[None]).logits[0]
        cache = model.prefill(ids)
        assert_close(cache.next_logits, ref[-1], tol=1e-5)
        # the causal forward_sequence path too, at every position
        with torch.no_grad():
            seq = model.forward_sequence(ids[None], torch.arange(length), torch.ones(length, length).tril().bool())
        assert_close(seq[0], ref, tol=1e-5)


@pytest.mark.parametrize("kind", list(MAKERS))
def test_bidirectional_block_matches_hf_with_float_mask(kind):
    hf, model = _pair(kind)
    cfg = model.config
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, cfg.vocab_size, (13,), generator=gen)
    tokens, parents = random_tree(gen, 4, cfg.block_size, cfg.vocab_size, cfg.mask_token_id)
    cache = model.prefill(prompt)
    p, b = cache.length, cfg.block_size
    mask = additive(prefix_then_block_mask(p, b))
    with torch.no_grad():
        dense = model(tokens, parents, cache)
        masked = (tokens == cfg.mask_token_id).flatten().nonzero().flatten()
        assert_close(model(tokens, parents, cache, logit_positions=masked), dense.flatten(0, 1)[masked], tol=1e-5)
        for n in range(tokens.shape[0]):
            ids = torch.cat((prompt, tokens[n]))[None]
            ref = hf(ids, attention_mask=mask).logits[0]
            assert_close(dense[n], ref[p:], tol=1e-5)
            if n == 0:  # write_block (bidirectional) gives the same next-token logits
                written = model.write_block(cache, tokens[0], causal=False)
                assert_close(written.next_logits, ref[-1], tol=1e-5)
        # causal block write == plain HF causal run over prompt + block
        written = model.write_block(cache, tokens[1], causal=True)
        ref = hf(torch.cat((prompt, tokens[1]))[None]).logits[0, -1]
    assert_close(written.next_logits, ref, tol=1e-5)


@pytest.mark.parametrize("kind", list(MAKERS))
def test_p1_p2_through_folded_verify(kind):
    hf, model = _pair(kind)
    cfg = model.config
    gen = torch.Generator().manual_seed(6)
    cache = model.prefill(torch.randint(0, cfg.vocab_size, (21,), generator=gen))
    cache = model.write_block(cache, torch.randint(0, cfg.vocab_size, (cfg.block_size,), generator=gen))
    tokens, parents = random_tree(gen, 6, cfg.block_size, cfg.vocab_size, cfg.mask_token_id)
    with torch.no_grad():
        dense = model(tokens, parents, cache)
        single = model(tokens[:1], parents[:1], cache)
    folded, masks = folded_verify(model, tokens, parents, cache, 0.0)
    assert not any(bool(m.any()) for m in masks)
    assert_close(folded, dense, tol=1e-5)
    folded, masks = folded_verify(model, tokens, parents, cache, 0.2)
    assert any(bool(m.any()) for m in masks)
    assert_close(folded[:1], single, tol=1e-5)


def test_options_and_bfloat16():
    hf = _qwen2(tie_word_embeddings=True, eos_token_id=[5, 6]).to(torch.bfloat16)
    model = from_hf(hf, mask_token_id=3, block_size=16, sub_block_size=8, shift_logits=True, family="nld")
    cfg = model.config
    assert (cfg.mask_token_id, cfg.block_size, cfg.sub_block_size, cfg.shift_logits, cfg.family) == \
        (3, 16, 8, True, "nld")
    assert cfg.eos_token_id == 5 and cfg.tie_word_embeddings and cfg.dtype == torch.bfloat16
    ids = torch.randint(0, cfg.vocab_size, (9,), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0, -1].float()
    got = model.prefill(ids).next_logits.float()
    assert got.dtype == torch.float32 and (got - ref).abs().max() <= 0.05 * max(1.0, float(ref.abs().max()))
    with pytest.raises(ValueError, match="family"):
        from_hf(hf, family="gpt")
    with pytest.raises(ValueError, match="mask_token_id"):
        from_hf(hf, mask_token_id=cfg.vocab_size)
    with pytest.raises(ValueError, match="sub_block_size"):
        from_hf(hf, block_size=16, sub_block_size=5)


def test_sliding_window_caps_positions():
    hf = _mistral(sliding_window=24)
    model = from_hf(hf, block_size=8)
    assert model.config.max_position_embeddings == 24
    cache = model.prefill(torch.arange(1, 17))
    with torch.no_grad():
        model(torch.ones(1, 8, dtype=torch.int64), torch.tensor([-1]), cache)  # 16 + 8 = 24: fine
    with pytest.raises(ValueError, match="cache"):
        model(torch.ones(1, 8, dtype=torch.int64), torch.tensor([-1]), model.prefill(torch.arange(1, 18)))
    with pytest.raises(ValueError, match="prompt_ids"):
        model.prefill(torch.arange(1, 26))
    assert from_hf(_mistral(sliding_window=None)).config.max_position_embeddings == 512


def test_unsupported_models_and_saving(tmp_path):
    with pytest.raises(TypeError, match="hf_model"):
        from_hf(torch.nn.Linear(2, 2))
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    with pytest.raises(TypeError, match="hf_model.*GPT2LMHeadModel"):
        from_hf(gpt2)
    _, model = _pair("qwen2")
    with pytest.raises(TypeError, match="save_pretrained"):
        model.save_pretrained(tmp_path)
