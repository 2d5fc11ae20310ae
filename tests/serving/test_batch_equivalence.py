"""Batching never changes an answer: every request decodes, batched, the tokens (and draft acceptances and
forward counts) of decoding it alone, on both families, in vanilla and Spiffy mode, whatever the other
requests are, how many slots there are and when each request arrives."""
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specfold_compile
from specfold_compile.testing import TINY_FAMILIES as FAMILIES, tiny_model
from specfold_compile.decoding import generate as generate_one
from specfold_compile.serving import Engine, RequestParams

HSET = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _prompts(model, lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    # ids below the eos/mask ids' neighbourhood are as good as any; the full range is allowed
    return [torch.randint(0, model.config.vocab_size, (n,), generator=gen) for n in lengths]


def _same(batched, alone):
    assert batched.tokens == alone.tokens
    assert batched.nfe == alone.nfe and batched.blocks == alone.blocks
    assert [s.accepted for s in batched.steps] == [s.accepted for s in alone.steps]
    assert [s.branches for s in batched.steps] == [s.branches for s in alone.steps]


@settings(max_examples=14, **HSET)
@given(family=st.sampled_from(FAMILIES), mode=st.sampled_from(["vanilla", "spiffy"]), seed=st.integers(0, 999),
       lengths=st.lists(st.integers(1, 50), min_size=1, max_size=5), max_new_tokens=st.integers(1, 60),
       threshold=st.sampled_from([0.5, 0.9, 1.0]), draft_budget=st.integers(0, 8), stop_at_eos=st.booleans())
def test_batch_of_prompts_is_each_prompt_alone(family, mode, seed, lengths, max_new_tokens, threshold,
                                               draft_budget, stop_at_eos):
    model = tiny_model(family)
    prompts = _prompts(model, lengths, seed)
    kwargs = dict(mode=mode, max_new_tokens=max_new_tokens, threshold=threshold, draft_budget=draft_budget,
                  stop_at_eos=stop_at_eos)
    batched = specfold_compile.generate(model, prompts, **kwargs)
    assert len(batched) == len(prompts)
    for prompt, result in zip(prompts, batched):
        _same(result, generate_one(model, prompt, **kwargs))


@settings(max_examples=12, **HSET)
@given(family=st.sampled_from(FAMILIES), mode=st.sampled_from(["vanilla", "spiffy"]), seed=st.integers(0, 999),
       requests=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 48), st.integers(0, 6), st.integers(0, 8),
                                   st.sampled_from([0.7, 0.9])), min_size=1, max_size=5),
       max_requests=st.integers(1, 4))
def test_arrival_order_and_slots_change_nothing(family, mode, seed, requests, max_requests):
    """Requests of their own parameters arrive at different steps (``arrive``: steps after the previous
    one), into a pool with fewer slots than requests: each one's tokens are its tokens alone."""
    model = tiny_model(family)
    prompts = _prompts(model, [r[0] for r in requests], seed)
    params = [RequestParams(max_new_tokens=n, threshold=th, draft_budget=d) for _, n, _, d, th in requests]
    engine = Engine(model, max_requests=max_requests, max_tokens_per_request=128, mode=mode)
    ids = []
    for prompt, p, (_, _, arrive, _, _) in zip(prompts, params, requests):
        for _ in range(arrive):
            engine.step()
        ids.append(engine.add_request(prompt, p))
    list(engine.run())
    assert engine.pool.free_slots == max_requests
    for prompt, p, request_id in zip(prompts, params, ids):
        out = engine.output(request_id)
        assert out.status == "finished"
        alone = generate_one(model, prompt, mode=mode, max_new_tokens=p.max_new_tokens, threshold=p.threshold,
                             draft_budget=p.draft_budget)
        _same(out.result, alone)
        assert out.tokens == out.result.tokens  # the streamed blocks are the result


def test_batching_is_real(model):
    """The engine verifies many requests in one forward: fewer forwards than the requests' own calls; and
    writes blocks finishing in the same step together (the same prompt twice finishes its blocks together)."""
    prompts = _prompts(model, [3, 20, 35], 1)
    prompts.append(prompts[0])
    engine = Engine(model, max_requests=4, max_tokens_per_request=128, mode="spiffy")
    ids = [engine.add_request(p, RequestParams(max_new_tokens=40, draft_budget=4, stop_at_eos=False))
           for p in prompts]
    list(engine.run())
    calls = sum(engine.output(i).result.num_calls for i in ids)
    assert engine.stats.verify_requests == calls and engine.stats.verify_calls < calls
    assert engine.stats.verify_rows == sum(s.branches for i in ids for s in engine.output(i).result.steps)
    assert engine.stats.written_blocks == sum(engine.output(i).result.blocks - 1 for i in ids)
    assert engine.stats.write_calls < engine.stats.written_blocks
    assert engine.output(ids[0]).tokens == engine.output(ids[3]).tokens


def test_single_prompt_generate_unchanged(model):
    prompt = torch.tensor([5, 6, 7, 8, 9])
    one = specfold_compile.generate(model, prompt, mode="spiffy", max_new_tokens=30, draft_budget=4)
    ref = generate_one(model, prompt, mode="spiffy", max_new_tokens=30, draft_budget=4)
    assert type(one) is type(ref)
    _same(one, ref)


@settings(max_examples=8, **HSET)
@given(family=st.sampled_from(FAMILIES), mode=st.sampled_from(["vanilla", "spiffy"]), seed=st.integers(0, 999),
       requests=st.lists(st.tuples(st.integers(1, 40), st.none() | st.integers(0, 12)), min_size=2, max_size=5))
def test_aborts_change_no_other_request(family, mode, seed, requests):
    """Requests aborted at random steps free their slots; the others decode their tokens alone, and an
    aborted request's streamed blocks are the start of its tokens alone."""
    model = tiny_model(family)
    prompts = _prompts(model, [r[0] for r in requests], seed)
    params = RequestParams(max_new_tokens=40, draft_budget=4, stop_at_eos=False)
    engine = Engine(model, max_requests=3, max_tokens_per_request=96, mode=mode)
    ids = [engine.add_request(p, params) for p in prompts]
    step = 0
    while engine.has_work:
        for request_id, (_, abort_at) in zip(ids, requests):
            if abort_at == step:
                engine.abort(request_id)
        engine.step()
        step += 1
    assert engine.pool.free_slots == 3
    for prompt, request_id, (_, abort_at) in zip(prompts, ids, requests):
        out = engine.output(request_id)
        alone = generate_one(model, prompt, mode=mode, max_new_tokens=40, draft_budget=4, stop_at_eos=False)
        if out.status == "finished":
            _same(out.result, alone)
        else:
            assert out.status == "aborted" and abort_at is not None and out.result is None
            assert out.tokens == alone.tokens[:len(out.tokens)] and len(out.tokens) < len(alone.tokens)
