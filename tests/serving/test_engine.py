"""The engine's request lifecycle: the block stream, continuous batching (a short request leaves while a
long one runs, and is not slowed by it), abort, failing requests, the pool's limits, argument errors."""
import pytest
import torch

import specfold_compile
from specfold_compile.testing import tiny_model
from specfold_compile.decoding import generate as generate_one
from specfold_compile.serving import Engine, PoolExhausted, RequestParams
from specfold_compile.serving.request import RequestDecode

LONG = RequestParams(max_new_tokens=64, stop_at_eos=False)
SHORT = RequestParams(max_new_tokens=5, stop_at_eos=False)


def _prompt(n, seed=0):
    return torch.randint(0, 90, (n,), generator=torch.Generator().manual_seed(seed))


def test_block_stream(model):
    engine = Engine(model, max_requests=2, max_tokens_per_request=128, mode="spiffy")
    ids = [engine.add_request(_prompt(7), LONG), engine.add_request(_prompt(20, 1), SHORT)]
    streams = {i: [] for i in ids}
    for out in engine.run():
        assert out.index == len(streams[out.request_id]) and out.error is None
        assert out.finished == (out.status == "finished")
        streams[out.request_id].append(out)
    for i in ids:
        result = engine.output(i).result
        assert [t for o in streams[i] for t in o.tokens] == result.tokens
        assert [o.finished for o in streams[i]] == [False] * (len(streams[i]) - 1) + [True]
        assert len(streams[i]) == result.blocks


def test_short_request_is_not_held_up(model):
    """A short request next to a long one finishes in the steps it needs alone, and leaves (its slot
    freed) while the long one still runs."""
    alone = Engine(model, max_requests=2, max_tokens_per_request=128)
    alone.add_request(_prompt(9, 2), SHORT)
    steps_alone = len(list(_steps(alone)))
    engine = Engine(model, max_requests=2, max_tokens_per_request=128)
    long_id = engine.add_request(_prompt(12, 3), LONG)
    short_id = engine.add_request(_prompt(9, 2), SHORT)
    for step in range(1, 200):
        engine.step()
        if engine.output(short_id).status == "finished":
            break
    assert step == steps_alone
    assert engine.output(long_id).status == "running" and engine.pool.free_slots == 1
    list(engine.run())
    assert engine.pool.free_slots == 2


def _steps(engine):
    while engine.has_work:
        yield engine.step()


def test_waiting_requests_join_as_slots_free(model):
    engine = Engine(model, max_requests=1, max_tokens_per_request=128)
    first, second = engine.add_request(_prompt(9, 2), SHORT), engine.add_request(_prompt(5, 4), SHORT)
    engine.step()
    assert engine.output(first).status == "running" and engine.output(second).status == "waiting"
    assert engine.num_running == 1 and engine.num_waiting == 1
    while engine.output(first).status == "running":
        engine.step()
    engine.step()
    assert engine.output(second).status in ("running", "finished")
    list(engine.run())
    ref = generate_one(model, _prompt(5, 4), max_new_tokens=5, stop_at_eos=False)
    assert engine.output(second).result.tokens == ref.tokens


def test_abort_frees_the_slot_and_leaves_the_others(model):
    engine = Engine(model, max_requests=3, max_tokens_per_request=128, mode="spiffy")
    keep = engine.add_request(_prompt(6, 5), LONG)
    gone = engine.add_request(_prompt(30, 6), LONG)
    queued = Engine(model, max_requests=1, max_tokens_per_request=128)
    for _ in range(3):
        engine.step()
    assert engine.pool.free_slots == 1
    assert engine.abort(gone) is True
    assert engine.pool.free_slots == 2 and engine.output(gone).status == "aborted"
    assert engine.abort(gone) is False
    list(engine.run())
    ref = generate_one(model, _prompt(6, 5), mode="spiffy", max_new_tokens=64, stop_at_eos=False)
    assert engine.output(keep).result.tokens == ref.tokens
    assert engine.abort(keep) is False and engine.pool.free_slots == 3
    # a waiting request is dropped from the queue
    a, b = queued.add_request(_prompt(4), SHORT), queued.add_request(_prompt(4), SHORT)
    assert queued.abort(b) and queued.num_waiting == 1
    list(queued.run())
    assert queued.output(a).status == "finished" and queued.output(b).status == "aborted"
    with pytest.raises(ValueError, match="request_id: no request 99 in this engine"):
        queued.abort(99)
    assert queued.pop(b).status == "aborted"
    with pytest.raises(ValueError, match="request_id: no request"):
        queued.output(b)


def test_pop_refuses_a_running_request(model):
    engine = Engine(model, max_requests=1, max_tokens_per_request=128)
    rid = engine.add_request(_prompt(4), LONG)
    engine.step()
    with pytest.raises(ValueError, match="request_id: request 0 is still running; abort it first"):
        engine.pop(rid)


@pytest.mark.parametrize("prompt, params, error, match", [
    ([1, 2, 3], None, TypeError, "prompt_ids must be a torch.Tensor"),
    (torch.tensor([1.0, 2.0]), None, TypeError, "prompt_ids must have dtype torch.int64"),
    (torch.zeros(2, 3, dtype=torch.long), None, ValueError, "prompt_ids must be a non-empty 1-D tensor"),
    (torch.tensor([1, 500]), None, ValueError, r"prompt_ids: ids must lie in \[0, 128\)"),
    (torch.arange(100), None, ValueError, "prompt_ids: a prompt of 100 tokens with max_new_tokens=128 needs"),
    (torch.arange(4), RequestParams(max_new_tokens=0), ValueError, "max_new_tokens must be >= 1"),
    (torch.arange(4), RequestParams(threshold=2.0), ValueError, r"threshold must be in \(0, 1\]"),
    (torch.arange(4), {"max_new_tokens": 3}, TypeError, "params: expected a RequestParams or None"),
])
def test_a_bad_request_fails_alone(model, prompt, params, error, match):
    """A request that cannot run is refused by add_request with a one-line error; the engine's other
    requests decode as before."""
    engine = Engine(model, max_requests=2, max_tokens_per_request=64)
    ok = engine.add_request(_prompt(8, 7), SHORT)
    engine.step()
    with pytest.raises(error, match=match) as info:
        engine.add_request(prompt, params)
    assert "\n" not in str(info.value)
    assert engine.num_running + engine.num_waiting == 1
    list(engine.run())
    ref = generate_one(model, _prompt(8, 7), max_new_tokens=5, stop_at_eos=False)
    assert engine.output(ok).result.tokens == ref.tokens and engine.pool.free_slots == 2


def test_a_request_failing_while_it_runs_fails_alone(model, monkeypatch):
    """A request whose prefill raises ends as failed (its slot freed, the error in its output and stream);
    the others decode their tokens."""
    engine = Engine(model, max_requests=3, max_tokens_per_request=128)
    prefill = model.prefill

    def failing(ids, **kwargs):
        if ids.numel() == 48:
            raise RuntimeError("this prompt breaks the prefill")
        return prefill(ids, **kwargs)

    monkeypatch.setattr(model, "prefill", failing)
    ok = [engine.add_request(_prompt(33, 8), SHORT), engine.add_request(_prompt(17, 9), SHORT)]
    bad = engine.add_request(_prompt(48, 10), SHORT)
    outputs = list(engine.run())
    failed = [o for o in outputs if o.request_id == bad]
    assert len(failed) == 1 and failed[0].status == "failed" and failed[0].finished and failed[0].tokens == []
    assert engine.output(bad).error == "RuntimeError: this prompt breaks the prefill"
    monkeypatch.undo()
    for rid, (n, seed) in zip(ok, [(33, 8), (17, 9)]):
        ref = generate_one(model, _prompt(n, seed), max_new_tokens=5, stop_at_eos=False)
        assert engine.output(rid).result.tokens == ref.tokens
    assert engine.pool.free_slots == 3


def test_a_request_failing_mid_decode_fails_alone(model):
    """A request whose commit step raises after a few calls ends as failed in that step; the requests
    verified in the same forward decode their tokens."""
    engine = Engine(model, max_requests=3, max_tokens_per_request=128, mode="spiffy")
    ok = [engine.add_request(_prompt(10, 11), LONG), engine.add_request(_prompt(21, 12), LONG)]
    bad = engine.add_request(_prompt(5, 13), LONG)
    for _ in range(3):
        engine.step()
    (decode,) = [d for d in engine._running if d.request_id == bad]

    def broken(conf, tok):
        raise RuntimeError("decoding made no progress (non-finite logits?)")

    decode.accept = broken
    outputs = engine.step()
    assert [o.status for o in outputs if o.request_id == bad] == ["failed"]
    assert engine.output(bad).error == "RuntimeError: decoding made no progress (non-finite logits?)"
    assert engine.pool.free_slots == 1 and engine.num_running == 2
    list(engine.run())
    for rid, (n, seed) in zip(ok, [(10, 11), (21, 12)]):
        ref = generate_one(model, _prompt(n, seed), mode="spiffy", max_new_tokens=64, stop_at_eos=False)
        assert engine.output(rid).result.tokens == ref.tokens


def test_pool_exhausted(model):
    engine = Engine(model, max_requests=2, max_tokens_per_request=64, max_waiting=1)
    for n in (3, 4, 5):
        engine.add_request(_prompt(n), SHORT)
    with pytest.raises(PoolExhausted, match="pool exhausted: all max_requests=2 slots hold a request and "
                                            "max_waiting=1 requests wait"):
        engine.add_request(_prompt(6), SHORT)
    with pytest.raises(ValueError, match="prompt_ids: ids must lie"):  # a bad request's own error first
        engine.add_request(torch.tensor([999]), SHORT)
    assert engine.num_waiting == 3
    list(engine.run())
    assert engine.pool.free_slots == 2
    assert engine.add_request(_prompt(6), SHORT) == 3  # room again; refused requests took no id


def test_submit_queues_a_decode_state_as_add_request_does(model):
    """``add_request`` is ``submit(new_decode(...))``: a state made by ``new_decode`` and subclassed (as
    bench/batched.py does) decodes as the request would; ``submit`` refuses one that does not fit."""
    class Counting(RequestDecode):
        calls = 0

        def rows(self, draft_budget=None):
            Counting.calls += 1
            return super().rows(draft_budget)

    engine = Engine(model, max_requests=2, max_tokens_per_request=128, mode="spiffy")
    plain = engine.add_request(_prompt(9, 3), LONG)
    decode = engine.new_decode(_prompt(9, 3), LONG)
    decode.__class__ = Counting
    assert engine.num_waiting == 1 and engine.submit(decode) == plain + 1
    list(engine.run())
    a, b = engine.output(plain).result, engine.output(plain + 1).result
    assert a.tokens == b.tokens and a.nfe == b.nfe and Counting.calls == len(b.steps) > 0
    small = Engine(model, max_requests=1, max_tokens_per_request=16)
    with pytest.raises(ValueError, match="prompt_ids: a prompt of 20 tokens with max_new_tokens=64 needs"):
        small.submit(small.new_decode(_prompt(20), LONG))
    assert small.num_waiting == 0


def test_pool_sized_by_the_user():
    model = tiny_model("tiny-nld")
    engine = Engine(model, max_requests=3, max_tokens_per_request=80)
    assert engine.pool.keys[0].shape[0] == 3 and engine.pool.capacity == 80
    # a prompt of 64 tokens and 16 new ones needs 64 prefix positions: fits; 17 new ones need 80: fits too
    engine.add_request(torch.arange(64), RequestParams(max_new_tokens=32))
    with pytest.raises(ValueError, match="needs 96 cache positions, beyond max_tokens_per_request=80"):
        engine.add_request(torch.arange(64), RequestParams(max_new_tokens=33))


def test_engine_arguments(model):
    with pytest.raises(ValueError, match=r"^tau: mode='specfold' needs the fold threshold"):
        Engine(model, mode="specfold")
    with pytest.raises(ValueError, match=r"^tau: only mode='specfold' folds, got mode='spiffy'$"):
        Engine(model, mode="spiffy", tau=0.1)
    for bad in (-0.1, float("nan"), "0.1", True):
        with pytest.raises(ValueError, match=r"^tau: expected a number >= 0"):
            Engine(model, mode="specfold", tau=bad)
    with pytest.raises(ValueError, match="mode: expected one of"):
        Engine(model, mode="greedy")
    with pytest.raises(ValueError, match="confidence_dtype: expected one of"):
        Engine(model, confidence_dtype="fp8")
    with pytest.raises(ValueError, match="max_waiting: expected None or an int >= 0"):
        Engine(model, max_waiting=-1)
    with pytest.raises(ValueError, match="max_requests: expected an int >= 1"):
        Engine(model, max_requests=0)
    with pytest.raises(TypeError, match="model: the serving engine needs a specfold_compile BlockDiffusionLM"):
        Engine(torch.nn.Linear(2, 2))


def test_batched_generate_arguments(model):
    prompts = [_prompt(4), _prompt(9)]
    with pytest.raises(ValueError, match="^loop: expected 'host' or 'device'"):
        specfold_compile.generate(model, prompts, loop="gpu")
    with pytest.raises(ValueError, match="compile_writes: a list of prompts is decoded by the batched engine"):
        specfold_compile.generate(model, prompts, compile_writes=True)
    with pytest.raises(ValueError, match="^cuda_graphs: expected False, True, 'eager' or a BatchGraphs"):
        specfold_compile.generate(model, prompts, cuda_graphs="yes")
    with pytest.raises(ValueError, match="^compile_layers: expected False, True"):
        specfold_compile.generate(model, prompts, compile_layers="nope")
    with pytest.raises(ValueError, match=r"^tau: mode='specfold' needs the fold threshold"):
        specfold_compile.generate(model, prompts, mode="specfold")
    with pytest.raises(ValueError, match="specfold_options: a list of prompts is decoded by the batched engine"):
        specfold_compile.generate(model, prompts, mode="specfold", tau=0.1, specfold_options={"kernels": "torch"})
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        specfold_compile.generate(model, prompts, colour=1)
    with pytest.raises(TypeError, match=r"prompt_ids\[1\]: expected a 1-D int64 tensor, got list"):
        specfold_compile.generate(model, [_prompt(4), [1, 2]])
    with pytest.raises(ValueError, match=r"prompt_ids\[1\]: ids must lie in \[0, 128\)"):
        specfold_compile.generate(model, [_prompt(4), torch.tensor([3, 999])])
    with pytest.raises(ValueError, match="prompt_ids: expected a non-empty list of prompts"):
        specfold_compile.generate(model, [])
    # fewer slots than prompts: the rest wait, the answers are the same
    few = specfold_compile.generate(model, prompts * 2, max_new_tokens=20, max_requests=1)
    many = specfold_compile.generate(model, prompts * 2, max_new_tokens=20)
    assert [r.tokens for r in few] == [r.tokens for r in many]
