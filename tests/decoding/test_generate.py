import pytest
import torch
from hypothesis import given, settings, strategies as hs

from decoding_fake_model import FakeModel
from specfold_compile.decoding import commit, confidence, generate, load_draft_graph

CONFIGS = [(8, None, 16), (8, 4, 16), (16, 8, 32), (16, None, 32)]


def prompt(*xs):
    return torch.tensor(xs, dtype=torch.long)


def literal_vanilla(model, p, max_new, threshold, stop_at_eos):
    """docs/SPEC.md section 1 read literally: every block decoded until no mask is left; the prompt laid out as
    the model's family does (``grid``: whole prompt blocks prefilled, the tail opening the first block)."""
    cfg = model.config
    B, rules = cfg.block_size, cfg.decoding_rules
    whole = p.numel() // B * B if rules.prompt_on_block_grid else p.numel()
    cache = model.prefill(p[:whole], block_causal=rules.prompt_on_block_grid)
    head = p[whole:].tolist()
    out = []
    while True:
        x = torch.full((B,), cfg.mask_token_id, dtype=torch.long)
        x[:len(head)] = torch.tensor(head, dtype=torch.long)
        if not head:
            x[0] = int(confidence(cache.next_logits, cfg.mask_token_id)[1])
        while bool((x == cfg.mask_token_id).any()):
            c, t = confidence(model(x[None], torch.tensor([-1]), cache)[0], cfg.mask_token_id)
            x = commit(x, c, t, cfg.mask_token_id, cfg.sub_block_size, threshold, rules.threshold_inclusive)
        out += x[len(head):].tolist()
        head = []
        if stop_at_eos and cfg.eos_token_id in out:
            return out[: out.index(cfg.eos_token_id) + 1][:max_new]
        if len(out) >= max_new:
            return out[:max_new]
        cache = model.write_block(cache, x)


@pytest.mark.parametrize("grid", [False, True])
@pytest.mark.parametrize("B,sb,V", CONFIGS)
def test_vanilla_matches_literal_rule(B, sb, V, grid):
    for seed in range(3):
        m = FakeModel(block_size=B, sub_block_size=sb, vocab_size=V, seed=seed, grid=grid)
        for stop in (True, False):
            for p in (prompt(2, 3, seed), prompt(*range(2, 2 + B)), prompt(*range(1, B + 4))):
                r = generate(m, p, max_new_tokens=45, stop_at_eos=stop, confidence_dtype="float32")
                assert r.tokens == literal_vanilla(m, p, 45, 0.9, stop)
                assert all(s.branches == 1 and s.accepted == 0 for s in r.steps)
                if grid and stop is False:  # the first block generates B - L mod B tokens
                    assert r.steps[0].rows[0, :p.numel() % B].tolist() == p[p.numel() // B * B:].tolist()


@pytest.mark.parametrize("grid", [False, True])
@pytest.mark.parametrize("B,sb,V", CONFIGS)
def test_p5_spiffy_lossless_and_fewer_forwards(B, sb, V, grid):
    tot_v = tot_s = 0
    for seed in range(4):
        for p in (prompt(2, 3, 4), prompt(7, seed), prompt(5, 5, 5, 5, 9), prompt(*range(1, B + 3))):
            m = FakeModel(block_size=B, sub_block_size=sb, vocab_size=V, seed=seed, grid=grid)
            v = generate(m, p, max_new_tokens=64)
            assert v.nfe == m.nfe
            m.calls.clear()
            s = generate(m, p, mode="spiffy", max_new_tokens=64, draft_budget=8)
            assert s.nfe == m.nfe
            assert s.tokens == v.tokens
            assert s.nfe <= v.nfe
            assert s.num_calls == v.num_calls - sum(x.accepted for x in s.steps)
            tot_v += v.nfe
            tot_s += s.nfe
    assert tot_s < tot_v


@settings(max_examples=40, deadline=None)
@given(seed=hs.integers(0, 10**6), cfg=hs.sampled_from(CONFIGS),
       threshold=hs.sampled_from([0.3, 0.6, 0.9, 0.99, 1.0]), budget=hs.integers(0, 10),
       p=hs.lists(hs.integers(0, 13), min_size=1, max_size=40), max_new=hs.integers(1, 40),
       stop=hs.booleans(), noise=hs.sampled_from([0.0, 0.35, 1.5]), grid=hs.booleans())
def test_p5_hypothesis(seed, cfg, threshold, budget, p, max_new, stop, noise, grid):
    B, sb, V = cfg
    m = FakeModel(block_size=B, sub_block_size=sb, vocab_size=V, seed=seed, noise=noise, grid=grid)
    pr = torch.tensor(p, dtype=torch.long)
    v = generate(m, pr, max_new_tokens=max_new, threshold=threshold, stop_at_eos=stop)
    s = generate(m, pr, mode="spiffy", max_new_tokens=max_new, threshold=threshold, draft_budget=budget,
                 stop_at_eos=stop)
    assert s.tokens == v.tokens
    assert s.nfe <= v.nfe
    assert 1 <= len(v.tokens) <= max_new
    if stop and m.config.eos_token_id in v.tokens:
        assert v.tokens.index(m.config.eos_token_id) == len(v.tokens) - 1
    elif not stop:
        assert len(v.tokens) == max_new
    for st in s.steps:
        assert st.branches <= budget + 1 and st.branches == len(st.parents) and st.parents[0] == -1


def test_budget_zero_is_vanilla():
    m = FakeModel(block_size=8, sub_block_size=4, seed=1)
    v = generate(m, prompt(1, 2), max_new_tokens=40)
    s = generate(m, prompt(1, 2), mode="spiffy", draft_budget=0, max_new_tokens=40)
    assert s.tokens == v.tokens and s.nfe == v.nfe and s.branches_per_call == 1.0


def test_result_fields_and_calls():
    m = FakeModel(block_size=8, sub_block_size=4, seed=0)
    s = generate(m, prompt(3, 4, 5, 0), mode="spiffy", max_new_tokens=64)
    assert s.wall_time_s > 0 and s.mode == "spiffy"
    assert len(s.calls) == s.num_calls == len(s.steps)
    assert [n for n, _ in s.calls] == [n for kind, n in m.calls if kind == "call"]
    assert s.accepted_per_call > 0 and s.branches_per_call > 1
    for (n, par), st in zip(s.calls, s.steps):
        assert st.rows.shape == (n, 8)
        assert all(0 <= par[i] < i for i in range(1, n))


def test_custom_graph_and_max_new():
    m = FakeModel(block_size=16, sub_block_size=8, vocab_size=32, seed=2)
    g = {"version": 1, "block_size": 16, "nodes": [{"level": 1, "ranks": [1]}, {"level": 1, "ranks": [1, 2]},
                                                 {"level": 2, "ranks": [1, 2]}, {"level": 2, "ranks": [1, 2, 3]}]}
    v = generate(m, prompt(4), max_new_tokens=20, stop_at_eos=False)
    s = generate(m, prompt(4), mode="spiffy", draft_graph=g, max_new_tokens=20, stop_at_eos=False)
    assert len(v.tokens) == 20 and s.tokens == v.tokens


def test_bad_inputs():
    m = FakeModel()
    p = prompt(1, 2)
    cases = [
        (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
        (dict(max_new_tokens=-3), ValueError, "max_new_tokens"),
        (dict(max_new_tokens=2.5), TypeError, "max_new_tokens"),
        (dict(threshold=0.0), ValueError, "threshold"),
        (dict(threshold=1.5), ValueError, "threshold"),
        (dict(threshold=float("nan")), ValueError, "threshold"),
        (dict(threshold="0.9"), TypeError, "threshold"),
        (dict(mode="greedy"), ValueError, "mode"),
        (dict(mode="spiffy", draft_budget=-1), ValueError, "draft_budget"),
        (dict(mode="spiffy", draft_graph={"version": 1, "nodes": [{"level": 1, "ranks": [9]}]}), ValueError,
         "draft_graph"),
        (dict(mode="spiffy", draft_graph={"version": 1, "block_size": 16, "nodes": []}), ValueError,
         "block size"),
        (dict(stop_at_eos=None), TypeError, "stop_at_eos"),
    ]
    for kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            generate(m, p, **kw)
    for bad, exc in [([1, 2], TypeError), (p.int(), TypeError), (p[None], ValueError),
                     (torch.tensor([], dtype=torch.long), ValueError)]:
        with pytest.raises(exc, match="prompt_ids"):
            generate(m, bad)
    assert m.nfe == 0  # nothing ran


def test_draft_graph_file(tmp_path):
    from specfold_compile.decoding import default_draft_graph, save_draft_graph
    path = tmp_path / "g.json"
    save_draft_graph(default_draft_graph(8, max_level=2, width=2), path)
    m = FakeModel(block_size=8, seed=5)
    v = generate(m, prompt(3), max_new_tokens=30)
    s = generate(m, prompt(3), mode="spiffy", draft_graph=str(path), max_new_tokens=30)
    assert s.tokens == v.tokens
    assert load_draft_graph(path, 8)


def test_mask_token_never_committed():
    m = FakeModel(block_size=8, sub_block_size=4, seed=4)
    m.base[..., m.config.mask_token_id] = 50.0  # the model "prefers" the mask token everywhere
    orig = m.__call__

    class Wrap:
        config = m.config
        prefill = staticmethod(m.prefill)
        write_block = staticmethod(m.write_block)

        def __call__(self, tokens, parents, cache, logit_positions=None):
            out = orig(tokens, parents, cache, logit_positions)
            out[..., m.config.mask_token_id] = 30.0
            return out

    w = Wrap()
    for mode in ("vanilla", "spiffy"):
        r = generate(w, prompt(1, 2), mode=mode, max_new_tokens=20)
        assert m.config.mask_token_id not in r.tokens and len(r.tokens) >= 1


@pytest.mark.parametrize("grid", [False, True])
@pytest.mark.parametrize("B,sb,V", CONFIGS)
def test_masked_logits_only(B, sb, V, grid):
    """By default the decoder asks for the masked positions' logits only: the model sees exactly those
    flat positions, and decoding is the same as with every position's logits (``all_logits=True``)."""
    seen = []

    class Spy(FakeModel):
        def __call__(self, tokens, parents, cache, logit_positions=None):
            seen.append((tokens.clone(), logit_positions))
            return super().__call__(tokens, parents, cache, logit_positions)

    for seed in range(3):
        for mode in ("vanilla", "spiffy"):
            m = Spy(block_size=B, sub_block_size=sb, vocab_size=V, seed=seed, noise=0.35, grid=grid)
            seen.clear()
            p = prompt(3, seed) if not grid else prompt(*range(1, B + 2 + seed))  # a whole block prefilled
            fast = generate(m, p, mode=mode, max_new_tokens=40, draft_budget=6)
            assert seen and all(torch.equal(pos, (t == m.config.mask_token_id).flatten().nonzero().flatten())
                                for t, pos in seen)
            seen.clear()
            full = generate(m, p, mode=mode, max_new_tokens=40, draft_budget=6, all_logits=True)
            assert all(pos is None for _, pos in seen)
            assert fast.tokens == full.tokens and fast.nfe == full.nfe
            assert [(s.branches, s.accepted, s.parents) for s in fast.steps] == \
                [(s.branches, s.accepted, s.parents) for s in full.steps]
    with pytest.raises(TypeError, match="all_logits"):
        generate(FakeModel(block_size=8, sub_block_size=4), prompt(1), all_logits=1)


def test_model_without_logit_positions_gets_a_hint():
    """A model whose forward takes no logit_positions, or ignores it, fails with a pointer to
    all_logits=True, and decodes with it."""
    m = FakeModel(block_size=8, sub_block_size=4, seed=2)

    class Old:
        config = m.config
        prefill = staticmethod(m.prefill)
        write_block = staticmethod(m.write_block)

        def __call__(self, tokens, parents, cache):
            return m(tokens, parents, cache)

    class Ignores(Old):
        def __call__(self, tokens, parents, cache, logit_positions=None):
            return m(tokens, parents, cache)

    for model in (Old(), Ignores()):
        with pytest.raises((TypeError, ValueError), match=r"^model: .*all_logits=True"):
            generate(model, prompt(1, 2), max_new_tokens=8)
        assert generate(model, prompt(1, 2), max_new_tokens=8, all_logits=True).tokens == \
            generate(m, prompt(1, 2), max_new_tokens=8).tokens
