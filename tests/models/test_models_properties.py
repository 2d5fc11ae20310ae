"""docs/SPEC.md section 3, P1-P4, for both families through ``reference.folded_verify``, plus a cross-check of
the verification forward (``specfold::branch_attention``) against ``forward_sequence`` (SDPA + mask)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models_testutil import FAMILY_PRESETS, assert_close, prefix_then_block_mask, random_tree
from specfold_compile.models import build
from specfold_compile.reference import folded_verify

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def model_kwargs(draw):
    kv = draw(st.sampled_from([1, 2, 4]))
    group = draw(st.sampled_from([1, 2, 3]))  # 1 = MHA, otherwise GQA
    return dict(
        num_layers=draw(st.integers(1, 3)),
        hidden_size=draw(st.integers(32, 128)),
        num_heads=kv * group,
        num_kv_heads=kv,
        head_dim=draw(st.sampled_from([8, 12, 16, 20])),
        intermediate_size=draw(st.integers(16, 96)),
        attention_bias=draw(st.booleans()),
    )


@st.composite
def cases(draw):
    preset = draw(st.sampled_from(FAMILY_PRESETS))
    kwargs = draw(model_kwargs())
    seed = draw(st.integers(0, 2**16))
    n_rows = draw(st.integers(1, 9))
    # tiny-nld's Llama-4 query scaling and YaRN switch at position 64: cross it sometimes
    prefix_len = draw(st.integers(1, 80))
    tau = draw(st.sampled_from([0.0, 0.01, 0.05, 0.1, 0.3, 1.0, 10.0]))
    return preset, kwargs, seed, n_rows, prefix_len, tau


_MODELS: dict = {}


def _model(preset, kwargs, seed):
    key = (preset, tuple(sorted(kwargs.items())), seed)
    if key not in _MODELS:
        if len(_MODELS) > 64:
            _MODELS.clear()
        _MODELS[key] = build(preset, seed=seed, **kwargs)
    return _MODELS[key]


def _setup(case):
    preset, kwargs, seed, n_rows, prefix_len, tau = case
    model = _model(preset, kwargs, seed)
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, cfg.vocab_size, (prefix_len,), generator=gen)
    cache = model.prefill(prompt)
    tokens, parents = random_tree(gen, n_rows, cfg.block_size, cfg.vocab_size, cfg.mask_token_id)
    return model, cache, tokens, parents, tau


@SETTINGS
@given(cases())
def test_p1_p2_p3(case):
    model, cache, tokens, parents, tau = _setup(case)
    with torch.no_grad():
        dense = model(tokens, parents, cache)
        single = model(tokens[:1], parents[:1], cache)
    folded0, masks0 = folded_verify(model, tokens, parents, cache, 0.0)
    assert len(masks0) == len(model.layers)
    assert not any(bool(m.any()) for m in masks0), "tau = 0 must fold nothing"
    # P1: tau = 0 equals the dense multi-branch forward
    assert_close(folded0, dense)
    # P2: the main row equals the single-branch forward at any tau (for both gate options)
    for gate in ("layer", "sublayer"):
        folded, masks = folded_verify(model, tokens, parents, cache, tau, gate=gate)
        assert not any(bool(m[0].any()) for m in masks), "row 0 never folds"
        assert_close(folded[:1], single)
    # P3: at tau = 0 each row equals running it alone
    for n in range(tokens.shape[0]):
        alone, _ = folded_verify(model, tokens[n:n + 1], torch.tensor([-1]), cache, 0.0)
        assert_close(folded0[n:n + 1], alone)


@SETTINGS
@given(cases(), st.sampled_from(["layer", "sublayer"]))
def test_p4_deterministic_given_masks(case, gate):
    model, cache, tokens, parents, tau = _setup(case)
    tau = max(tau, 0.3)  # make folds likely
    logits, masks = folded_verify(model, tokens, parents, cache, tau, gate=gate)
    again, masks_again = folded_verify(model, tokens, parents, cache, tau, gate=gate)
    assert torch.equal(logits, again)
    assert all(torch.equal(a, b) for a, b in zip(masks, masks_again))
    # Forcing the masks it returned reproduces the output that produced them (tau is then irrelevant).
    for forced_tau in (tau, 0.0, 100.0):
        forced, used = folded_verify(model, tokens, parents, cache, forced_tau, fold_masks=masks, gate=gate)
        assert torch.equal(forced, logits)
        assert all(torch.equal(a, b) for a, b in zip(used, masks))
    # Arbitrary forced masks (row 0 never folds) give a deterministic output.
    gen = torch.Generator().manual_seed(int(tokens.sum()))
    arbitrary = [torch.rand(m.shape, generator=gen) < 0.5 for m in masks]
    for m in arbitrary:
        m[0] = False
    a, _ = folded_verify(model, tokens, parents, cache, 0.0, fold_masks=arbitrary, gate=gate)
    b, _ = folded_verify(model, tokens, parents, cache, 0.0, fold_masks=[m.clone() for m in arbitrary], gate=gate)
    assert torch.equal(a, b)
    # The main row does not depend on the drafts' folds.
    assert_close(a[:1], logits[:1])


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_identical_draft_folds_to_parent(preset):
    """A draft equal to its parent folds everywhere at tau > 0 and reproduces the parent's logits."""
    model = build(preset, seed=3)
    cfg = model.config
    gen = torch.Generator().manual_seed(0)
    cache = model.prefill(torch.randint(0, cfg.vocab_size, (9,), generator=gen))
    tokens, parents = random_tree(gen, 3, cfg.block_size, cfg.vocab_size, cfg.mask_token_id)
    tokens = torch.cat((tokens, tokens[2:3]))
    parents = torch.cat((parents, torch.tensor([2])))
    logits, masks = folded_verify(model, tokens, parents, cache, 0.1)
    assert all(bool(m[3].all()) for m in masks)
    assert torch.equal(logits[3], logits[2])
    # and a draft that differs somewhere recomputes at least that position in the first layer
    assert not bool(masks[0][1][tokens[1] != tokens[int(parents[1])]].any())


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(FAMILY_PRESETS), model_kwargs(), st.integers(0, 2**16), st.integers(1, 70),
       st.booleans())
def test_verify_matches_forward_sequence(preset, kwargs, seed, prompt_len, written_block):
    """N = 1 verification == forward_sequence over [prompt; (written block;) block] with the decoding mask,
    at the block positions (the family's shift applied to the block slice)."""
    model = _model(preset, kwargs, seed)
    cfg = model.config
    gen = torch.Generator().manual_seed(seed + 1)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=gen)
    tokens, parents = random_tree(gen, 1, cfg.block_size, cfg.vocab_size, cfg.mask_token_id)
    cache = model.prefill(prompt)
    seq = [prompt]
    allowed = torch.ones(prompt_len, prompt_len, dtype=torch.bool).tril()
    if written_block:
        done = torch.randint(0, cfg.vocab_size, (cfg.block_size,), generator=gen)
        cache = model.write_block(cache, done)
        seq.append(done)
        causal = cfg.family == "nld"
        p, b = prompt_len, cfg.block_size
        allowed = torch.ones(p + b, p + b, dtype=torch.bool).tril()
        if not causal:
            allowed[p:, p:] = True
    p = cache.length
    full = prefix_then_block_mask(p, cfg.block_size)
    full[:p, :p] = allowed
    ids = torch.cat(seq + [tokens[0]])
    with torch.no_grad():
        seq_logits = model.forward_sequence(ids[None], torch.arange(ids.numel()), full)
        verify = model(tokens, parents, cache)
    assert_close(verify, model.shift(seq_logits[:, p:]))
    # the cache's seed logits are the sequence's last prefix position
    assert_close(cache.next_logits, seq_logits[0, p - 1])


def test_shift_semantics():
    """Fast-dLLM v2 reads position p from p-1 (position 0 from the block's last position: the next
    block's first token); NLD does not shift."""
    fast, nld = build("tiny-fast-dllm-v2"), build("tiny-nld")
    x = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3)
    shifted = fast.shift(x)
    assert torch.equal(shifted[:, 0], x[:, -1]) and torch.equal(shifted[:, 1:], x[:, :-1])
    assert torch.equal(nld.shift(x), x)


@settings(max_examples=30, deadline=None)
@given(cases(), st.data())
def test_logit_positions_select_rows(case, data):
    """``logit_positions`` returns exactly those positions' logits of the full forward, in the given order
    (duplicates allowed), the family's shift included."""
    model, cache, tokens, parents, _ = _setup(case)
    total = tokens.numel()
    flat = data.draw(st.lists(st.integers(0, total - 1), min_size=1, max_size=2 * total))
    positions = torch.tensor(flat, dtype=torch.int64)
    with torch.no_grad():
        full = model(tokens, parents, cache)
        some = model(tokens, parents, cache, logit_positions=positions)
    assert some.shape == (len(flat), model.config.vocab_size)
    assert_close(some, full.flatten(0, 1)[positions])
