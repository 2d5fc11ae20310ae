"""``generate(fuse_boundaries=True)``: a block's first state verified by the pass that writes the prefix
before it. The passes give that state the logits of its own N = 1 call; decodes keep their tokens (P5)
with fewer forwards (Fast-dLLM v2), and NLD, which has no seed prediction, is unchanged; a wrong guess of
the seed falls back to the block's own first call."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfold_compile.decoding import VerifyGraphs, boundaries, generate
from specfold_compile.testing import TINY_FAMILIES, assert_close, tiny_model

HSET = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
MODELS = {name: tiny_model(name) for name in TINY_FAMILIES}


def _random_state(model, gen, masked: float = 0.6) -> torch.Tensor:
    cfg = model.config
    state = torch.randint(0, cfg.vocab_size, (cfg.block_size,), generator=gen)
    state[torch.rand(cfg.block_size, generator=gen) < masked] = cfg.mask_token_id
    return state


@settings(max_examples=12, **HSET)
@given(name=st.sampled_from(TINY_FAMILIES), seed=st.integers(0, 10**6), prompt_len=st.integers(1, 40),
       static=st.booleans())
def test_a_fused_write_gives_the_next_state_its_own_call_logits(name, seed, prompt_len, static):
    """write_block(next_block=X): the cache is the plain write's, and ``next_block_logits`` are what
    ``model(X[None], [-1], cache)`` gives on it (dynamic and static caches)."""
    model = MODELS[name]
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=gen)
    block = torch.randint(0, cfg.vocab_size, (cfg.block_size,), generator=gen)
    nxt = _random_state(model, gen)
    with torch.no_grad():
        def cache():
            c = model.prefill(prompt)
            return model.static_cache(c, prompt_len + 3 * cfg.block_size) if static else c

        plain = model.write_block(cache(), block)
        fused = model.write_block(cache(), block, next_block=nxt)
        assert fused.length == plain.length and fused.next_block_logits.shape == (cfg.block_size, cfg.vocab_size)
        assert_close(fused.next_logits, plain.next_logits)
        for a, b in zip(fused.keys + fused.values, plain.keys + plain.values):
            assert_close(a[:, :plain.length], b[:, :plain.length])
        want = model(nxt[None], torch.tensor([-1]), plain)[0]
    assert_close(fused.next_block_logits, want)


@pytest.mark.parametrize("block_causal", [True, False])
def test_a_fused_prefill_gives_the_first_state_its_own_call_logits(block_causal):
    model = MODELS["tiny-fast-dllm-v2"]
    cfg = model.config
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (2 * cfg.block_size,), generator=gen)
    first = _random_state(model, gen)
    with torch.no_grad():
        plain = model.prefill(prompt, block_causal=block_causal)
        fused = model.prefill(prompt, block_causal=block_causal, next_block=first)
        assert fused.length == plain.length
        assert_close(fused.next_logits, plain.next_logits)
        want = model(first[None], torch.tensor([-1]), plain)[0]
    assert_close(fused.next_block_logits, want)


def test_next_block_is_checked():
    model = MODELS["tiny-fast-dllm-v2"]
    cfg = model.config
    prompt = torch.arange(5)
    block = torch.arange(cfg.block_size)
    with torch.no_grad():
        with pytest.raises(TypeError, match="next_block: expected None or an int64 tensor of shape"):
            model.write_block(model.prefill(prompt), block, next_block=torch.arange(3))
        static = model.static_cache(model.prefill(prompt), 5 + cfg.block_size)  # room for the block only
        with pytest.raises(ValueError, match="next_block: positions up to .* exceed the static cache's capacity"):
            model.write_block(static, block, next_block=block.clone())
        with pytest.raises(ValueError, match="next_block: an empty prompt"):
            model.prefill(torch.zeros(0, dtype=torch.long), next_block=block.clone())
    for bad in (1, "all", None):
        with pytest.raises(ValueError, match=r"^fuse_boundaries: expected False, True or 'writes', got"):
            generate(model, prompt, fuse_boundaries=bad)


def _fused(result) -> int:
    return sum(s.fused for s in result.steps)


@settings(max_examples=10, **HSET)
@given(name=st.sampled_from(TINY_FAMILIES), seed=st.integers(0, 10**6), prompt_len=st.integers(1, 40),
       max_new=st.integers(1, 40), budget=st.sampled_from([0, 4, 16]), loop=st.sampled_from(["host", "device"]),
       graphs=st.booleans())
def test_fused_boundaries_decode_the_same_tokens_with_fewer_forwards(name, seed, prompt_len, max_new, budget, loop,
                                                                   graphs):
    """Token for token the decode without fusion; every fused step is one forward fewer; NLD never fuses;
    the host and device loops agree (launched, and on a static cache)."""
    model = MODELS[name]
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(1, model.config.vocab_size, (prompt_len,), generator=gen)
    for mode in ("vanilla", "spiffy"):
        kwargs = dict(mode=mode, max_new_tokens=max_new, draft_budget=budget, stop_at_eos=False)
        plain = generate(model, prompt, **kwargs)
        fused = generate(model, prompt, fuse_boundaries=True, loop=loop,
                         cuda_graphs=VerifyGraphs(model, replay="eager") if graphs else False, **kwargs)
        assert fused.tokens == plain.tokens
        assert fused.nfe == plain.nfe - _fused(fused)
        if name == "tiny-nld":
            assert _fused(fused) == 0
        if loop == "device":
            host = generate(model, prompt, fuse_boundaries=True, **kwargs)
            assert [(s.branches, s.accepted, s.fused) for s in host.steps] == \
                [(s.branches, s.accepted, s.fused) for s in fused.steps]


@pytest.mark.parametrize("loop", ["host", "device"])
def test_writes_only_fusion_leaves_the_prefill_alone(loop):
    """``fuse_boundaries="writes"``: a prompt tail's first state gets its own call (the prefill verifies
    nothing), the block writes still fuse; the same tokens, one forward fewer a fused step."""
    model = MODELS["tiny-fast-dllm-v2"]
    B = model.config.block_size
    prompt = torch.arange(1, 2 * B + 3) % model.config.vocab_size  # ends in a partial block
    kwargs = dict(mode="spiffy", max_new_tokens=3 * B, stop_at_eos=False, loop=loop)
    plain = generate(model, prompt, **kwargs)
    everything = generate(model, prompt, fuse_boundaries=True, **kwargs)
    writes = generate(model, prompt, fuse_boundaries="writes", **kwargs)
    assert writes.tokens == plain.tokens == everything.tokens
    assert everything.steps[0].fused and not writes.steps[0].fused
    assert writes.nfe == plain.nfe - _fused(writes) and _fused(writes) == _fused(everything) - 1
    assert _fused(writes) > 0, "no block write fused: the test decodes too few blocks"


def test_a_prompt_tail_fuses_the_first_step_exactly():
    """Fast-dLLM v2, L mod B != 0 with whole blocks before the tail: the prefill verifies the first state."""
    model = MODELS["tiny-fast-dllm-v2"]
    B = model.config.block_size
    prompt = torch.arange(1, 2 * B + 3) % model.config.vocab_size
    result = generate(model, prompt, max_new_tokens=4, stop_at_eos=False, fuse_boundaries=True)
    assert result.steps[0].fused and result.nfe == len(result.steps)  # the prefill and no call of its own
    assert result.tokens == generate(model, prompt, max_new_tokens=4, stop_at_eos=False).tokens


@pytest.mark.parametrize("loop", ["host", "device"])
def test_a_wrong_seed_guess_falls_back_to_the_blocks_own_call(monkeypatch, loop):
    """Every guess made wrong: each write verifies a state that is not the block's, whose logits are dropped;
    the decode is the unfused one, call for call (only prompt-tail prefills fuse)."""
    model = MODELS["tiny-fast-dllm-v2"]
    V = model.config.vocab_size
    real = boundaries.seed_guess
    made = []

    def wrong(model_, steps_done, guess, *args):
        state = real(model_, steps_done, guess, *args)
        if state is not None:
            state[0] = (int(state[0]) + 1) % V or 1  # never the right seed, never the mask token (0)
            made.append(int(state[0]))
        return state

    monkeypatch.setattr(boundaries, "seed_guess", wrong)
    prompt = torch.arange(1, 20)
    kwargs = dict(mode="spiffy", max_new_tokens=60, stop_at_eos=False)
    plain = generate(model, prompt, **kwargs)
    fused = generate(model, prompt, fuse_boundaries=True, loop=loop, **kwargs)
    # the prompt's tail is known, not guessed: its prefill fuses the first step, and nothing else fuses
    assert made and fused.tokens == plain.tokens
    assert [s.fused for s in fused.steps] == [len(prompt) % model.config.block_size > 0] + [False] * (len(fused.steps) - 1)
    assert fused.nfe == plain.nfe - _fused(fused)
    assert [(s.branches, s.accepted) for s in fused.steps] == [(s.branches, s.accepted) for s in plain.steps]


@pytest.fixture(scope="module")
def shipped():
    from specfold_compile.loading import DEFAULT_MODEL_DIR, load_model

    return load_model(None), str(DEFAULT_MODEL_DIR / "draft_graph.json")


@pytest.mark.parametrize("task", ["math", "code"])
def test_the_shipped_model_guesses_seeds_and_keeps_its_tokens(shipped, task):
    """On the trained model the seed guesses mostly hold: fewer forwards, the same tokens, both loops."""
    from specfold_compile.loading import encode
    from specfold_compile.tasks import sample

    model, graph = shipped
    saved = 0
    for problem in sample(task, "test", 2, 0):
        prompt = encode(model, problem.prompt)
        kwargs = dict(mode="spiffy", max_new_tokens=96, draft_graph=graph, stop_at_eos=False)
        plain = generate(model, prompt, **kwargs)
        for loop in ("host", "device"):
            fused = generate(model, prompt, fuse_boundaries=True, loop=loop, **kwargs)
            assert fused.tokens == plain.tokens and fused.nfe == plain.nfe - _fused(fused)
        saved += _fused(fused)
    assert saved > 0
