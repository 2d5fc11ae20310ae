"""``Engine(loop="device")``: the bookkeeping of every request of a step as tensor ops on the device
(``serving.device_steps``) decodes the tokens and forwards of ``loop="host"``, the readable reference,
whatever the requests' params, arrivals and aborts; its argument errors."""
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specfold_compile
from specfold_compile.testing import TINY_FAMILIES as FAMILIES, tiny_model
from specfold_compile.serving import Engine, RequestParams

HSET = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decode(model, loop, mode, cuda_graphs, requests, max_requests, abort_after=None, tau=0.0, keep=None, **engine):
    """Tokens, forwards and blocks of each request (``requests``: (prompt length, max_new_tokens, draft
    budget, threshold, steps before it arrives)), and SpecFold's fold masks; ``abort_after``: the first
    request aborted after that many steps; ``keep``: a list the engine's ``device_steps`` is appended to;
    ``engine``: more ``Engine`` arguments."""
    gen = torch.Generator().manual_seed(len(requests))
    engine = Engine(model, max_requests=max_requests, max_tokens_per_request=128, mode=mode, loop=loop,
                    cuda_graphs=cuda_graphs, **(dict(tau=tau) if mode == "specfold" else {}), **engine)
    if keep is not None:
        keep.append(engine.device_steps)
    ids, steps = [], 0
    for length, new, budget, threshold, arrive in requests:
        for _ in range(arrive):
            engine.step()
            steps += 1
        prompt = torch.randint(0, model.config.vocab_size, (length,), generator=gen)
        ids.append(engine.add_request(prompt, RequestParams(max_new_tokens=new, draft_budget=budget,
                                                            threshold=threshold)))
    while engine.has_work:
        if abort_after is not None and steps == abort_after:
            engine.abort(ids[0])
        engine.step()
        steps += 1
    assert engine.pool.free_slots == max_requests
    outs = [engine.output(i) for i in ids]
    return [(o.status, o.tokens, [m.tolist() for m in o.fold_masks])
            + ((o.result.nfe, o.result.blocks, [(s.branches, s.accepted, list(s.parents)) for s in o.result.steps])
               if o.result else ()) for o in outs]


@settings(max_examples=25, **HSET)
@given(family=st.sampled_from(FAMILIES), mode=st.sampled_from(["vanilla", "spiffy", "specfold"]),
       tau=st.sampled_from([0.0, 0.3]), max_requests=st.integers(1, 3),
       requests=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 40), st.integers(0, 6),
                                   st.sampled_from([0.5, 0.9, 1.0]), st.integers(0, 3)), min_size=1, max_size=4))
def test_device_loop_is_the_host_loop(family, mode, tau, max_requests, requests):
    """Mixed params (several kinds of decode in one step), arrivals mid-run and reused slots; SpecFold at
    tau > 0 folds by each call's parents, so its masks and tokens check them too."""
    model = tiny_model(family)
    host = _decode(model, "host", mode, False, requests, max_requests, tau=tau)
    assert _decode(model, "device", mode, False, requests, max_requests, tau=tau) == host
    assert all(status == "finished" for status, *_ in host)


@pytest.mark.parametrize("family", FAMILIES)
def test_folds_follow_the_device_built_parents(family):
    """SpecFold at tau > 0 with drafts of drafts: the host's copy of each call's parents (read back with
    the step) feeds the folded forward, so the masks and tokens are the host loop's."""
    model = tiny_model(family)
    requests = [(9, 40, 6, 0.9, 0), (9, 40, 6, 0.9, 0)]
    host = _decode(model, "host", "specfold", False, requests, 2, tau=0.3)
    assert _decode(model, "device", "specfold", False, requests, 2, tau=0.3) == host
    engine = Engine(model, max_requests=1, max_tokens_per_request=128, mode="specfold", tau=0.3, loop="device")
    rid = engine.add_request(torch.arange(9), RequestParams(max_new_tokens=40, draft_budget=6))
    for _ in engine.run():
        pass
    assert any(p > 0 for step in engine.output(rid).result.steps for p in step.parents), "no draft of a draft"


@pytest.mark.parametrize("family", FAMILIES)
def test_device_loop_is_the_host_loop_from_graphs(family):
    """Replayed passes (``cuda_graphs="eager"``: the graphs' buffers and the ragged kernel, in the Triton
    interpreter here, so one small case a family): SpecFold's folded and draftless forwards, two kinds of
    decode, a late arrival."""
    model = tiny_model(family)
    requests = [(9, 10, 3, 0.9, 0), (5, 6, 2, 0.7, 1)]
    host = _decode(model, "host", "specfold", "eager", requests, 2, tau=0.3)
    steps = []
    assert _decode(model, "device", "specfold", "eager", requests, 2, tau=0.3, keep=steps) == host
    # the bookkeeping replayed too: a graph a kind of decode, padded request count and row count
    assert steps[0].captures >= 2 and steps[0].replays >= 1
    assert any(m for _, _, masks, *_ in host for call in masks for m in call), "nothing folded"
    assert all(status == "finished" for status, *_ in host)


@pytest.mark.parametrize("family", FAMILIES)
def test_abort_under_the_device_loop(family):
    model = tiny_model(family)
    requests = [(9, 40, 4, 0.9, 0), (20, 30, 2, 0.9, 0), (5, 20, 3, 0.7, 1)]
    host = _decode(model, "host", "spiffy", False, requests, 2, abort_after=2)
    with warnings.catch_warnings():  # torch.vmap falls back to a loop over the requests for an op it cannot batch
        warnings.filterwarnings("error", message=".*performance drop.*")
        assert _decode(model, "device", "spiffy", False, requests, 2, abort_after=2) == host
    assert host[0][0] == "aborted" and all(status == "finished" for status, *_ in host[1:])


@settings(max_examples=12, **HSET)
@given(family=st.sampled_from(FAMILIES), mode=st.sampled_from(["spiffy", "specfold"]),
       max_verify_rows=st.integers(1, 12), max_requests=st.integers(1, 3),
       requests=st.lists(st.tuples(st.integers(1, 30), st.integers(8, 40), st.integers(2, 8),
                                   st.sampled_from([0.9, 1.0]), st.integers(0, 2)), min_size=1, max_size=4))
def test_drafts_cut_under_load_on_the_device_loop(family, mode, max_verify_rows, max_requests, requests):
    """``max_verify_rows`` under ``loop="device"``: each call built with the whole budget, then cut to the
    request's share, is the call the host loop builds with that budget: the same forwards (rows, parents,
    SpecFold's masks at tau 0.3) and tokens."""
    model = tiny_model(family)
    host = _decode(model, "host", mode, False, requests, max_requests, tau=0.3, max_verify_rows=max_verify_rows)
    assert _decode(model, "device", mode, False, requests, max_requests, tau=0.3,
                   max_verify_rows=max_verify_rows) == host


@pytest.mark.parametrize("family", FAMILIES)
def test_device_loop_cuts_drafts_as_the_host_loop_builds_them(family):
    """Three requests of six drafts, at most five rows a forward: calls are cut, to the host loop's."""
    model = tiny_model(family)
    requests = [(9, 40, 6, 0.9, 0), (14, 40, 6, 0.9, 0), (5, 40, 6, 0.9, 0)]
    host = _decode(model, "host", "spiffy", False, requests, 3, max_verify_rows=5)
    kept = []
    assert _decode(model, "device", "spiffy", False, requests, 3, max_verify_rows=5, keep=kept) == host
    assert kept[0].cuts > 0
    assert any(branches > 1 for *_, steps in host for branches, _, _ in steps), "no drafts left to verify"


def test_compiled_bookkeeping_is_the_host_loop():
    """``compile_step`` (the default when replaying on CUDA): each kind's batched bookkeeping through
    torch.compile (Inductor on the CPU here), two kinds of decode with two and one requests a step: the
    host loop's tokens and forwards, every step compiled (a fallback to the eager ops warns, which fails)."""
    from torch._dynamo.utils import counters

    model = tiny_model(FAMILIES[0])
    requests = [(9, 24, 4, 0.9, 0), (9, 24, 4, 0.9, 0), (5, 16, 0, 0.7, 0)]
    host = _decode(model, "host", "spiffy", False, requests, 3)
    kept, compiled = [], counters["stats"]["unique_graphs"]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="device loop")
        assert _decode(model, "device", "spiffy", False, requests, 3, keep=kept, compile_step="inductor") == host
    assert kept[0].compile_error is None and len(kept[0]._steps) == 2
    assert kept[0].captures > 0  # launched, the compiled step runs on padded buffers (a bucket compiles once)
    assert all(step.compiled is not None for step in kept[0]._steps.values())
    assert counters["stats"]["unique_graphs"] - compiled >= 2


def test_loop_argument_errors(model):
    with pytest.raises(ValueError, match="loop: expected 'host' or 'device'"):
        Engine(model, loop="gpu")
    with pytest.raises(ValueError, match="compile_step: only loop='device'"):
        Engine(model, compile_step=True)
    with pytest.raises(ValueError, match="compile_step: expected None, a bool"):
        Engine(model, loop="device", compile_step=1)


def test_generate_on_a_list_takes_the_device_loop(model):
    prompts = [torch.arange(5), torch.arange(3, 20)]
    batched = specfold_compile.generate(model, prompts, mode="spiffy", max_new_tokens=24, loop="device")
    alone = [specfold_compile.generate(model, p, mode="spiffy", max_new_tokens=24) for p in prompts]
    assert [(r.tokens, r.nfe) for r in batched] == [(a.tokens, a.nfe) for a in alone]


def test_engines_sharing_graphs_share_the_replayed_steps():
    """A ``BatchGraphs`` handed to the next engine brings the device loop's step graphs along: the second
    engine replays them (no capture) and decodes the same tokens."""
    from specfold_compile.serving import BatchGraphs

    model = tiny_model(FAMILIES[0])
    graphs = BatchGraphs(model, 1, 128, "eager")
    requests = [(9, 8, 3, 0.9, 0)]
    kept = []
    first = _decode(model, "device", "spiffy", graphs, requests, 1, keep=kept)
    captured = kept[0].captures
    assert _decode(model, "device", "spiffy", graphs, requests, 1, keep=kept) == first
    assert kept[1] is kept[0] and kept[0].captures == captured and kept[0].replays > 0
    assert first == _decode(model, "host", "spiffy", False, requests, 1)
    # the replayed steps read back the drafts' order too: cut under max_verify_rows as the host loop builds them
    cut = _decode(model, "device", "spiffy", graphs, requests, 1, keep=kept, max_verify_rows=2)
    assert cut == _decode(model, "host", "spiffy", False, requests, 1, max_verify_rows=2) and kept[2].cuts > 0
