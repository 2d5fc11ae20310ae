"""The block-causal prefill (Fast-dLLM v2's, ``prefill(block_causal=True)``) against ``forward_sequence``
under ``block_causal_mask`` over the same tokens: its seed logits and the K/V it caches."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from models_testutil import FAMILY_PRESETS, assert_close, random_tree
from specfold_compile.models import build
from specfold_compile.models.cache import block_causal_mask

_MODELS: dict = {}


def _model(preset: str, block_size: int):
    key = (preset, block_size)
    if key not in _MODELS:
        _MODELS[key] = build(preset, seed=len(_MODELS), block_size=block_size,
                             **({"sub_block_size": block_size // 2} if preset == "tiny-fast-dllm-v2" else {}))
    return _MODELS[key]


def _recorded_kv(model, ids: torch.Tensor, allowed: torch.Tensor):
    """forward_sequence's logits and, per layer, the keys and values its attention read ([Hkv, S, D], as
    a cache holds them), recorded from each layer's q/k/v step."""
    keys, values = [], []
    originals = [layer.qkv for layer in model.layers]

    def recording(original):
        def qkv(h, pos):
            q, k, v = original(h, pos)
            keys.append(k[0].transpose(0, 1))
            values.append(v[0].transpose(0, 1))
            return q, k, v
        return qkv

    try:
        for layer, original in zip(model.layers, originals):
            layer.qkv = recording(original)
        with torch.no_grad():
            logits = model.forward_sequence(ids[None], torch.arange(ids.numel()), allowed)
    finally:
        for layer in model.layers:
            del layer.qkv  # back to the class's method
    return logits[0], keys, values


def test_block_causal_mask_by_hand():
    pos = torch.arange(6)
    got = block_causal_mask(pos, pos, 2).int().tolist()
    assert got == [[1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0],
                   [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]
    # a block at [4, 8) after a prefix of 4 keys: every key of the prefix and of its own block
    assert bool(block_causal_mask(torch.arange(4, 8), torch.arange(8), 4).all())
    assert block_causal_mask(torch.tensor([5]), torch.arange(8), 4).int().tolist() == [[1] * 8]
    assert block_causal_mask(torch.tensor([3]), torch.arange(8), 4).int().tolist() == [[1] * 4 + [0] * 4]


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(FAMILY_PRESETS), st.sampled_from([8, 16]), st.integers(1, 70), st.integers(0, 2**16))
def test_block_causal_prefill_equals_forward_sequence(preset, block_size, length, seed):
    """Seed logits = the sequence's last position; cached K/V = those forward_sequence's attention read,
    at every layer (so every later block sees the prompt as the block-causal mask trains it)."""
    model = _model(preset, block_size)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (length,), generator=gen)
    cache = model.prefill(ids, block_causal=True)
    pos = torch.arange(length)
    logits, keys, values = _recorded_kv(model, ids, block_causal_mask(pos, pos, block_size))
    assert cache.length == length
    assert_close(cache.next_logits, logits[-1])
    for got, want in zip((*cache.keys, *cache.values), (*keys, *values)):
        assert got.shape == want.shape
        assert_close(got, want)
    if length > block_size:  # a different mask from the causal prefill's (past the first layer's K/V)
        causal = model.prefill(ids)
        assert float((causal.next_logits - cache.next_logits).abs().max()) > 1e-4


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(FAMILY_PRESETS), st.integers(0, 4), st.integers(1, 5), st.integers(0, 2**16))
def test_block_after_the_block_causal_prefill_is_the_block_causal_sequence(preset, blocks, n_rows, seed):
    """On the absolute grid the verification forward of the next block (prefix = whole prompt blocks,
    possibly none: the empty cache) equals forward_sequence over [prompt; block] under the block-causal
    mask at the block's positions, the family's shift applied; and so does a block write after it."""
    model = _model(preset, 16)
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, cfg.vocab_size, (blocks * cfg.block_size,), generator=gen)
    tokens, parents = random_tree(gen, n_rows, cfg.block_size, cfg.vocab_size, cfg.mask_token_id)
    cache = model.prefill(prompt, block_causal=True)
    ids = torch.cat((prompt, tokens[0]))
    pos = torch.arange(ids.numel())
    with torch.no_grad():
        seq = model.forward_sequence(ids[None], pos, block_causal_mask(pos, pos, cfg.block_size))
        verify = model(tokens, parents, cache)
    assert_close(verify[:1], model.shift(seq[:, prompt.numel():]))
    written = model.write_block(cache, tokens[0], causal=False)
    assert_close(written.next_logits, seq[0, -1])


def test_compiled_block_causal_prefill_one_graph_for_every_length():
    """prefill(block_causal=True, compiled=True): the eager prefill's caches, one graph for prompts of any
    length (the length is traced as dynamic)."""
    import torch._dynamo.testing

    model = build("tiny-fast-dllm-v2", seed=0)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    model.__dict__["_compiled_methods"] = {
        "prefill_block_causal": torch.compile(model.prefill_block_causal, backend=counter)}
    try:
        with torch.inference_mode():
            for length in (16, 48, 32, 19):
                ids = torch.arange(length) % model.config.vocab_size
                eager, comp = model.prefill(ids, block_causal=True), model.prefill(ids, block_causal=True,
                                                                                  compiled=True)
                for a, b in zip(eager.keys + eager.values + [eager.next_logits],
                                comp.keys + comp.values + [comp.next_logits]):
                    assert a.shape == b.shape
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert counter.frame_count == 1, counter.frame_count
    finally:
        model.__dict__.pop("_compiled_methods", None)
        torch._dynamo.reset()


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_family_decoding_rules(preset):
    """The family's reference conventions are a property of its config (decoding reads them)."""
    rules = build(preset).config.decoding_rules
    fast = preset == "tiny-fast-dllm-v2"
    assert (rules.prompt_on_block_grid, rules.threshold_inclusive, rules.argmax_of_probs) == (fast, not fast, fast)
