"""SpecFold in the serving engine: the batched folded forward is each request's ``reference.folded_verify``
alone (its fold masks exactly, its logits bit for bit on the CPU), and a request decoded by
``Engine(mode="specfold")`` gets the tokens of its batch-1 SpecFold decode (``generate(mode="specfold")``
through the compiled backend): at tau = 0 (where it is also Spiffy's), and at tau > 0 with the batch-1
forward's folds forced to the masks the engine's gates chose; a request's masks do not depend on the
other requests in the batch. The shipped model too, on task-suite prompts, in every mode."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specfold_compile
from specfold_compile.decoding import default_draft_graph, generate as generate_one, load_draft_graph
from specfold_compile.decoding.decoder import _decode
from specfold_compile.decoding.specfold import specfold_forward
from specfold_compile.ops.fold_masks import forced_fold_masks, recorded_fold_masks
from specfold_compile.reference import folded_verify
from specfold_compile.serving import Engine, RequestParams
from specfold_compile.serving.folded import verify_batch_folded
from specfold_compile.serving.forward import verify_batch
from specfold_compile.serving.pool import KVPool
from specfold_compile.testing import TINY_FAMILIES as FAMILIES, identity_head, realistic_tree, tiny_model

HSET = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
OPTIONS = {"kernels": "torch"}  # the batch-1 SpecFold forward: the backend's PyTorch ops (CPU)


@pytest.fixture(scope="module", autouse=True)
def fresh_dynamo():
    """The batch-1 SpecFold forwards compile here: from a fresh Dynamo, so that no recompile limit left by
    other modules turns them eager."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _prompts(model, lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, model.config.vocab_size, (n,), generator=gen) for n in lengths]


def _calls(result):
    return [(s.branches, s.accepted, list(s.parents)) for s in result.steps]


def _same(batched, alone):
    assert batched.tokens == alone.tokens
    assert (batched.nfe, batched.blocks) == (alone.nfe, alone.blocks)
    assert _calls(batched) == _calls(alone)


def _requests(model, lengths, counts, gen):
    pool = KVPool(model, len(lengths), 64)
    caches, slots, rows, parents, positions = [], [], [], [], []
    mask = model.config.mask_token_id
    for i, (length, n) in enumerate(zip(lengths, counts)):
        prompt = torch.randint(0, model.config.vocab_size, (length,), generator=gen)
        cache = model.prefill(prompt) if length else model.empty_cache()
        slot = pool.allocate()
        pool.load(slot, cache.keys, cache.values)
        r, p = realistic_tree(model, n, int(torch.randint(0, 2**16, (1,), generator=gen)))
        caches.append(cache), slots.append(slot), rows.append(r), parents.append(p)
        positions.append((r == mask).flatten().nonzero().flatten())
    return pool, caches, slots, rows, parents, positions


# --- the batched folded forward ---------------------------------------------------------------------

@settings(max_examples=10, **HSET)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**16),
       lengths=st.lists(st.integers(0, 40), min_size=1, max_size=4),
       counts=st.lists(st.integers(1, 7), min_size=4, max_size=4), tau=st.sampled_from([0.0, 0.05, 0.2, 1.0]),
       gate=st.sampled_from(["layer", "sublayer"]))
def test_folded_forward_is_each_request_alone(family, seed, lengths, counts, tau, gate):
    model = tiny_model(family)
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        pool, caches, slots, rows, parents, positions = _requests(model, lengths, counts[:len(lengths)], gen)
        logits, masks = verify_batch_folded(model, pool, slots, rows, parents, positions, tau, gate=gate)
        if tau == 0:  # nothing folds: the dense batched forward, bit for bit
            assert not any(m.any() for m in masks)
            assert all(torch.equal(a, b) for a, b in zip(logits, verify_batch(model, pool, slots, rows, positions)))
        with identity_head(model):
            normed, again = verify_batch_folded(model, pool, slots, rows, parents, positions, tau, gate=gate)
        for i, (r, p, cache) in enumerate(zip(rows, parents, caches)):
            ref, used = folded_verify(model, r, p, cache, tau, gate=gate)
            assert masks[i].shape == (len(used), r.shape[0], r.shape[1]) and masks[i].dtype == torch.bool
            assert torch.equal(masks[i], torch.stack(used)) and torch.equal(again[i], masks[i])
            torch.testing.assert_close(logits[i], ref.flatten(0, 1)[positions[i]], rtol=1e-5, atol=1e-5)
            with identity_head(model):
                ref_normed, _ = folded_verify(model, r, p, cache, tau, gate=gate)
            assert torch.equal(normed[i], ref_normed.flatten(0, 1)[positions[i]])


@settings(max_examples=6, **HSET)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**16),
       lengths=st.lists(st.integers(0, 40), min_size=2, max_size=3), p_fold=st.sampled_from([0.3, 0.8]))
def test_forced_masks_are_each_request_alone(family, seed, lengths, p_fold):
    """Forced fold masks (random ones, main rows excepted) are folded exactly, and give each request the
    reference's output under the same masks (SPEC P4)."""
    model = tiny_model(family)
    gen = torch.Generator().manual_seed(seed)
    gates = len(model.layers)
    with torch.inference_mode():
        pool, caches, slots, rows, parents, positions = _requests(model, lengths, [6] * len(lengths), gen)
        forced = []
        for r in rows:
            m = torch.rand(gates, *r.shape, generator=gen) < p_fold
            m[:, 0] = False
            forced.append(m)
        with identity_head(model):
            normed, masks = verify_batch_folded(model, pool, slots, rows, parents, positions, 0.0, fold_masks=forced)
            for i, (r, p, cache) in enumerate(zip(rows, parents, caches)):
                ref, _ = folded_verify(model, r, p, cache, 0.0, fold_masks=list(forced[i]))
                assert torch.equal(masks[i], forced[i])
                assert torch.equal(normed[i], ref.flatten(0, 1)[positions[i]])


def test_folded_forward_arguments(model):
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        pool, _, slots, rows, parents, positions = _requests(model, [5, 9], [3, 4], gen)
        good = dict(parents=parents, logit_positions=positions, tau=0.1)

        def call(**changes):
            verify_batch_folded(model, pool, slots, rows, **dict(good, **changes))

        call()
        with pytest.raises(ValueError, match=r"^parents: expected a list of 2 \(one per slot\)"):
            call(parents=parents[:1])
        with pytest.raises(ValueError, match=r"^parents\[1\]: expected int64 \[4\]"):
            call(parents=[parents[0], parents[1][:3]])
        with pytest.raises(ValueError, match=r"^parents\[1\]: parents\[3\] must lie in \[0, 3\)"):
            call(parents=[parents[0], torch.tensor([-1, 0, 1, 3])])
        with pytest.raises(ValueError, match=r"^parents\[0\]: parents\[0\] must be -1"):
            call(parents=[torch.tensor([0, 0, 1]), parents[1]])
        with pytest.raises(ValueError, match=r"^tau: expected a number >= 0"):
            call(tau=-1.0)
        with pytest.raises(ValueError, match=r"^gate: expected one of"):
            call(gate="head")
        gates, block = len(model.layers), model.config.block_size
        masks = [torch.zeros(gates, 3, block, dtype=torch.bool), torch.zeros(gates, 4, block, dtype=torch.bool)]
        call(fold_masks=masks)
        with pytest.raises(ValueError, match=rf"^fold_masks\[1\]: expected a bool tensor \[{gates}, 4, {block}\]"):
            call(fold_masks=[masks[0], masks[1][:, :3]])
        row0 = masks[1].clone()
        row0[0, 0, 2] = True
        with pytest.raises(ValueError, match=r"^fold_masks\[1\]: row 0 \(the request's main branch\) never folds$"):
            call(fold_masks=[masks[0], row0])


# --- decoding -----------------------------------------------------------------------------------

class ForcedForward:
    """``generate(mode="specfold")``'s batch-1 forward (``specfold_forward``) with each call's fold masks
    forced, in order, to ``masks`` (one bool [G, N, B] a call, as ``RequestOutput.fold_masks``)."""

    def __init__(self, model, tau, masks):
        self.forward = specfold_forward(model, tau, OPTIONS)
        self.masks = list(masks)
        rows = max([1] + [m.shape[1] for m in self.masks])
        self.buffer = torch.zeros(len(model.layers), rows, model.config.block_size, dtype=torch.bool)
        self.calls = 0

    def __call__(self, rows, parents, cache, **kwargs):
        mask = self.masks[self.calls]
        assert mask.shape[1] == rows.shape[0]
        self.buffer.zero_()
        self.buffer[:, :mask.shape[1]] = mask
        self.calls += 1
        return self.forward(rows, parents, cache, **kwargs)


def _batch1_forced(model, prompt, params, tau, masks):
    """The request's batch-1 SpecFold decode, folding exactly ``masks``; also what its gates folded."""
    forward = ForcedForward(model, tau, masks)
    graph = load_draft_graph(default_draft_graph(model.config.block_size), model.config.block_size)
    with torch.inference_mode(), forced_fold_masks(forward.buffer), recorded_fold_masks() as seen:
        result = _decode(model, prompt, "specfold", params.max_new_tokens, float(params.threshold), params.draft_budget,
                         graph, params.stop_at_eos, forward=forward)
    assert forward.calls == len(masks)
    return result, seen


@settings(max_examples=8, **HSET)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 999),
       lengths=st.lists(st.integers(1, 45), min_size=1, max_size=4), max_new_tokens=st.integers(1, 40),
       draft_budget=st.integers(0, 8), threshold=st.sampled_from([0.5, 0.9]))
def test_tau0_is_batch1_specfold_and_batched_spiffy(family, seed, lengths, max_new_tokens, draft_budget, threshold):
    model = tiny_model(family)
    prompts = _prompts(model, lengths, seed)
    kwargs = dict(max_new_tokens=max_new_tokens, draft_budget=draft_budget, threshold=threshold)
    folded = specfold_compile.generate(model, prompts, mode="specfold", tau=0.0, **kwargs)
    spiffy = specfold_compile.generate(model, prompts, mode="spiffy", **kwargs)
    for prompt, f, s in zip(prompts, folded, spiffy):
        assert f.mode == "specfold"
        _same(f, s)
        _same(f, generate_one(model, prompt, mode="specfold", tau=0.0, specfold_options=OPTIONS, **kwargs))


def _run(model, prompts, params, arrivals, tau, max_requests):
    engine = Engine(model, max_requests=max_requests, max_tokens_per_request=160, mode="specfold", tau=tau)
    ids = []
    for prompt, p, arrive in zip(prompts, params, arrivals):
        for _ in range(arrive):
            engine.step()
        ids.append(engine.add_request(prompt, p))
    list(engine.run())
    return engine, [engine.output(i) for i in ids]


REQUESTS = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 48), st.integers(0, 5), st.integers(2, 8),
                              st.sampled_from([0.7, 0.9])), min_size=1, max_size=4)


@settings(max_examples=8, **HSET)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 999), requests=REQUESTS,
       tau=st.sampled_from([0.05, 0.2, 0.5]), max_requests=st.integers(1, 4))
def test_tau_is_batch1_given_the_masks(family, seed, requests, tau, max_requests):
    """Requests of their own parameters arriving at different steps, fewer slots than requests: each
    request's tokens, acceptances and forwards are those of its batch-1 SpecFold decode with that decode's
    folds forced to the masks the engine's gates chose for it (and its gates fold exactly those); its
    masks are the ones it gets alone in the engine."""
    model = tiny_model(family)
    prompts = _prompts(model, [r[0] for r in requests], seed)
    params = [RequestParams(max_new_tokens=n, threshold=th, draft_budget=d) for _, n, _, d, th in requests]
    engine, outs = _run(model, prompts, params, [r[2] for r in requests], tau, max_requests)
    assert engine.pool.free_slots == max_requests
    for prompt, p, out in zip(prompts, params, outs):
        assert out.status == "finished" and out.result.mode == "specfold"
        assert [m.shape[1] for m in out.fold_masks] == [s.branches for s in out.result.steps]
        alone, seen = _batch1_forced(model, prompt, p, tau, out.fold_masks)
        _same(out.result, alone)
        multi = [m for m in out.fold_masks if m.shape[1] > 1]  # N = 1 calls run the plain graph: no gate
        assert len(seen) == sum(m.shape[0] for m in multi)
        for k, m in enumerate(multi):
            for g in range(m.shape[0]):
                assert torch.equal(seen[k * m.shape[0] + g][1], m[g])
        _, (solo,) = _run(model, [prompt], [p], [0], tau, 1)
        assert len(solo.fold_masks) == len(out.fold_masks)
        assert all(torch.equal(a, b) for a, b in zip(solo.fold_masks, out.fold_masks))
        _same(solo.result, out.result)


def test_specfold_folds_and_counts(model):
    """The engine folds at tau > 0 (its stats count it), decodes other tokens than at tau = 0 on some
    request, and a huge tau folds more than a small one."""
    prompts = _prompts(model, [3, 20, 35, 9], 1)
    params = RequestParams(max_new_tokens=48, draft_budget=8, stop_at_eos=False)
    ratios, tokens = {}, {}
    for tau in (0.0, 0.2, 1e9):
        engine = Engine(model, max_requests=4, max_tokens_per_request=128, mode="specfold", tau=tau)
        ids = [engine.add_request(p, params) for p in prompts]
        list(engine.run())
        outs = [engine.output(i) for i in ids]
        stats = engine.stats
        assert stats.gated_draft_positions == sum(int(m[:, 1:].numel()) for o in outs for m in o.fold_masks)
        assert stats.folded_draft_positions == sum(int(m.sum()) for o in outs for m in o.fold_masks)
        assert stats.verify_calls < sum(o.result.num_calls for o in outs)  # batched
        ratios[tau], tokens[tau] = stats.recompute_ratio, [o.tokens for o in outs]
    assert ratios[0.0] == 1.0 and ratios[1e9] < ratios[0.2] < 1.0
    assert tokens[1e9] != tokens[0.0]



@pytest.mark.parametrize("family", FAMILIES)
def test_the_ragged_attention_path_folds_alike(family):
    """attention="ragged": the per-request path's fold masks forced, the same logits to float32 rounding
    (the kernel sums the prefix in another order), empty prefixes and ragged branch counts included."""
    model = tiny_model(family)
    gen = torch.Generator().manual_seed(11)
    with torch.inference_mode():
        pool, _, slots, rows, parents, positions = _requests(model, [0, 17, 40], [1, 7, 4], gen)
        base, masks = verify_batch_folded(model, pool, slots, rows, parents, positions, 0.2)
        ragged, again = verify_batch_folded(model, pool, slots, rows, parents, positions, 0.2, fold_masks=masks,
                                            attention="ragged")
    assert any(m.any() for m in masks) and all(torch.equal(a, b) for a, b in zip(again, masks))
    for a, b in zip(ragged, base):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def shipped():
    from specfold_compile.loading import default_model_available, encode, load_model
    from specfold_compile.tasks import sample

    if not default_model_available():
        pytest.skip("no shipped model")
    model = load_model(None)
    return model, [encode(model, p.prompt) for task in ("math", "code", "instruct") for p in sample(task, "test", 2)]


@pytest.mark.parametrize("stop_at_eos", [True, False])
def test_the_shipped_model_batched_is_each_prompt_alone(shipped, stop_at_eos):
    """The shipped model on task-suite prompts, six requests on three slots (they join as others leave;
    without the eos stop every one decodes all its tokens): each request decodes, batched, its batch-1
    decode in every mode (vanilla's tokens; Spiffy's and SpecFold's at tau = 0 with Spiffy's acceptances
    and forwards), and at tau = 0.1 its batch-1 SpecFold decode folding the masks the engine chose."""
    model, prompts = shipped
    params = RequestParams(max_new_tokens=48, stop_at_eos=stop_at_eos)
    kwargs = dict(max_new_tokens=48, stop_at_eos=stop_at_eos, max_requests=3)
    vanilla = specfold_compile.generate(model, prompts, mode="vanilla", **kwargs)
    spiffy = specfold_compile.generate(model, prompts, mode="spiffy", **kwargs)
    folded = specfold_compile.generate(model, prompts, mode="specfold", tau=0.0, **kwargs)
    engine, outs = _run(model, prompts, [params] * len(prompts), [0] * len(prompts), 0.1, 3)
    assert engine.stats.folded_draft_positions > 0  # the shipped model's drafts fold at this tau
    assert sum(v.nfe for v in vanilla) > sum(s.nfe for s in spiffy)  # and they are accepted
    for prompt, v, s, f, out in zip(prompts, vanilla, spiffy, folded, outs):
        alone = generate_one(model, prompt, mode="spiffy", max_new_tokens=48, stop_at_eos=stop_at_eos)
        _same(s, alone)
        _same(f, alone)
        assert v.tokens == alone.tokens and v.nfe >= alone.nfe
        forced, _ = _batch1_forced(model, prompt, params, 0.1, out.fold_masks)
        _same(out.result, forced)
