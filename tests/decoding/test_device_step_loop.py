"""``generate(..., loop="device")`` against the Python loop: the same tokens, the same forwards, the same
calls (rows, accepted drafts, parents), on the fake models, both tiny families and the shipped model."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoding_fake_model import FakeModel
from specfold_compile.decoding import VerifyGraphs, default_draft_graph, generate
from test_device_step import draft_graphs

HSET = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def calls(result):
    return [(s.branches, s.accepted, list(s.parents)) for s in result.steps]


def assert_same_decode(model, prompt, steps_per_read=1, **kwargs):
    host = generate(model, prompt, **kwargs)
    device = generate(model, prompt, loop="device", steps_per_read=steps_per_read, **kwargs)
    assert device.tokens == host.tokens
    assert device.nfe == host.nfe and device.blocks == host.blocks
    assert calls(device) == calls(host)
    return host, device


@settings(max_examples=25, **HSET)
@given(seed=st.integers(0, 10**6), cfg=st.sampled_from([(8, None, 16), (8, 4, 16), (16, 8, 32)]),
       threshold=st.sampled_from([0.3, 0.9, 1.0]), budget=st.integers(0, 6),
       p=st.lists(st.integers(0, 13), min_size=1, max_size=20), max_new=st.integers(1, 30),
       stop=st.booleans(), grid=st.booleans(), steps_per_read=st.sampled_from([1, 1, 2, 3]), data=st.data())
def test_fake_models_decode_the_same(seed, cfg, threshold, budget, p, max_new, stop, grid, steps_per_read, data):
    """(``steps_per_read`` > 1: steps launched ahead, read back together.)"""
    block, sub, vocab = cfg
    model = FakeModel(block_size=block, sub_block_size=sub, vocab_size=vocab, seed=seed, grid=grid)
    graph = data.draw(draft_graphs(block))
    prompt = torch.tensor(p, dtype=torch.long)
    for mode in ("vanilla", "spiffy"):
        assert_same_decode(model, prompt, steps_per_read, mode=mode, max_new_tokens=max_new, threshold=threshold,
                           draft_budget=budget, draft_graph=graph, stop_at_eos=stop, confidence_dtype="float32")


def test_spiffy_on_the_device_accepts_drafts():
    """Not only vanilla in disguise: the device loop accepts drafts and saves forwards."""
    saved = accepted = 0
    for seed in range(3):
        model = FakeModel(block_size=8, sub_block_size=4, seed=seed)
        prompt = torch.tensor([2, 3, seed])
        vanilla, _ = assert_same_decode(model, prompt, max_new_tokens=40)
        _, spiffy = assert_same_decode(model, prompt, mode="spiffy", max_new_tokens=40, draft_budget=6)
        saved += vanilla.nfe - spiffy.nfe
        accepted += sum(s.accepted for s in spiffy.steps)
    assert saved > 0 and accepted > 0


def test_steps_launched_ahead_are_read_together_and_change_nothing(monkeypatch):
    """``steps_per_read=3``: the host reads once per three launched steps; the steps launched after a
    block's last one ran (more forwards than calls) and changed nothing (the Python loop's decode)."""
    from specfold_compile.decoding.device_loop import DeviceDecoder

    reads, runs = [], []
    steps, run = DeviceDecoder.steps, DeviceDecoder._run
    monkeypatch.setattr(DeviceDecoder, "steps", lambda self, n, cache, masked: reads.append(n) or steps(self, n, cache, masked))
    monkeypatch.setattr(DeviceDecoder, "_run", lambda self, n, width, cache: runs.append(n) or run(self, n, width, cache))
    model = FakeModel(block_size=8, sub_block_size=4, seed=1)
    _, device = assert_same_decode(model, torch.tensor([2, 3, 1]), 3, mode="spiffy", max_new_tokens=40,
                                   draft_budget=6)
    assert len(runs) == 3 * len(reads) > len(device.steps) > len(reads)
    assert [n for i, n in enumerate(runs) if i % 3] == [7] * (2 * len(reads))  # ahead: the full call


def test_steps_per_read_is_checked():
    model = FakeModel(block_size=8, sub_block_size=4)
    prompt = torch.tensor([2, 3])
    with pytest.raises(ValueError, match="steps_per_read"):
        generate(model, prompt, loop="device", steps_per_read=0)
    with pytest.raises(ValueError, match="steps_per_read: only loop='device'"):
        generate(model, prompt, steps_per_read=2)
    with pytest.raises(TypeError, match="steps_per_read"):
        generate(model, prompt, loop="device", steps_per_read=2.0)


@pytest.mark.parametrize("mode", ["vanilla", "spiffy"])
def test_tiny_families_decode_the_same(model, mode):
    """Both families (random weights), launched and on a static cache (``VerifyGraphs(replay="eager")``:
    the step graphs' bookkeeping with the model called again), kept across prompts."""
    graphs = VerifyGraphs(model, replay="eager")
    kwargs = dict(mode=mode, max_new_tokens=20, draft_budget=4, stop_at_eos=False,
                  draft_graph=default_draft_graph(model.config.block_size, 3, 2))
    for i, p in enumerate(([5, 6, 7, 8, 9], [2, 90, 17, 33, 4, 61, 12] * 3)):
        prompt = torch.tensor(p)
        host, _ = assert_same_decode(model, prompt, **kwargs)
        replayed = generate(model, prompt, loop="device", cuda_graphs=graphs, **kwargs)
        assert replayed.tokens == host.tokens and replayed.nfe == host.nfe and calls(replayed) == calls(host)
        assert replayed.graph_captures + replayed.graph_replays == len(host.steps)
        if i:  # the second prompt replays the first one's step graphs
            assert replayed.graph_replays > 0
        ahead = generate(model, prompt, loop="device", cuda_graphs=graphs, steps_per_read=3, **kwargs)
        assert (ahead.tokens, ahead.nfe, calls(ahead)) == (host.tokens, host.nfe, calls(host))
        assert ahead.graph_captures + ahead.graph_replays >= len(host.steps)  # and those launched past a block's end


@pytest.fixture(scope="module")
def shipped():
    from specfold_compile.loading import DEFAULT_MODEL_DIR, default_model_available, load_model

    if not default_model_available():
        pytest.skip("no shipped model")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model(None), str(DEFAULT_MODEL_DIR / "draft_graph.json")
    torch.set_num_threads(n)


@pytest.mark.parametrize("task", ["math", "code"])
def test_shipped_model_decodes_the_same(shipped, task):
    from specfold_compile.loading import encode
    from specfold_compile.tasks import sample

    model, graph = shipped
    prompt = encode(model, sample(task, "test", 1)[0].prompt)
    for mode in ("vanilla", "spiffy"):
        for stop in (True, False):  # past eos too: more blocks
            host, _ = assert_same_decode(model, prompt, mode=mode, max_new_tokens=48, draft_graph=graph,
                                         stop_at_eos=stop)
            assert len(host.tokens) == 48 or (stop and host.tokens[-1] == model.config.eos_token_id)


def test_loop_argument_is_checked():
    model = FakeModel()
    with pytest.raises(ValueError, match="loop: expected 'host' or 'device'"):
        generate(model, torch.tensor([2, 3]), loop="gpu")


def test_compiled_bookkeeping_decodes_the_same():
    """``compile_step=True`` (the CUDA default): the bookkeeping through torch.compile (Inductor on the
    CPU here), the same decode as the Python loop; a fallback to the eager ops (a warning) fails."""
    import warnings

    from specfold_compile.decoding import load_draft_graph
    from specfold_compile.decoding.device_loop import decode_on_device

    model = FakeModel(block_size=8, sub_block_size=4, seed=2)
    graph = load_draft_graph(default_draft_graph(8, 3, 2), 8)
    prompt = torch.tensor([2, 3, 4])
    host = generate(model, prompt, mode="spiffy", max_new_tokens=24, draft_budget=3, draft_graph=graph)
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.filterwarnings("error", message="device loop")
        device = decode_on_device(model, prompt, "spiffy", 24, 0.9, 3, graph, True, compile_step=True)
    assert device.tokens == host.tokens and device.nfe == host.nfe and calls(device) == calls(host)
    assert sum(s.accepted for s in host.steps) > 0


@pytest.mark.parametrize("family", ["fast-dllm-v2", "nld"])
def test_specfold_tau0_on_the_device_loop(family):
    """A SpecFold-compiled model (tau 0, torch kernels) in the device loop: its multi-branch calls fold,
    and the decode is the eager Python loop's."""
    from specfold_compile.backend import collect_stats
    from specfold_compile.testing import ModelSpec

    model = ModelSpec(family=family, layers=2, block=8, seed=7).build()
    prompt = torch.tensor([1, 5, 9, 2, 7, 3])
    kwargs = dict(mode="spiffy", max_new_tokens=12, draft_budget=6, stop_at_eos=False)
    host = generate(model, prompt, **kwargs)
    compiled = torch.compile(model, backend="specfold", options={"tau": 0.0, "kernels": "torch"})
    with collect_stats() as stats:
        device = generate(compiled, prompt, loop="device", **kwargs)
    assert device.tokens == host.tokens and device.nfe == host.nfe and calls(device) == calls(host)
    assert stats.calls == len(device.steps) - device.blocks > 0  # every call after a block's first one folds


def test_specfold_mode_on_the_device_loop():
    """``mode="specfold"`` compiles the forward itself; the device loop verifies through it (its calls
    reach the backend) and, at tau 0, decodes Spiffy's tokens with Spiffy's forwards."""
    from specfold_compile.backend import collect_stats
    from specfold_compile.testing import ModelSpec

    model = ModelSpec(family="fast-dllm-v2", layers=2, block=8, seed=3).build()
    prompt = torch.tensor([1, 5, 9, 2, 7, 3])
    kwargs = dict(max_new_tokens=12, draft_budget=6, stop_at_eos=False)
    host = generate(model, prompt, mode="spiffy", **kwargs)
    with collect_stats() as stats:
        device = generate(model, prompt, mode="specfold", tau=0.0, specfold_options={"kernels": "torch"},
                          loop="device", **kwargs)
    assert device.tokens == host.tokens and device.nfe == host.nfe and calls(device) == calls(host)
    assert stats.calls > 0


@settings(max_examples=4, **HSET)
@given(seed=st.integers(0, 10**6), share=st.sampled_from([0.3, 0.8]))
def test_forced_fold_masks_on_the_device_loop(seed, share):
    """With the same fold masks forced on every gate (P4: they fix each folded call's output), the device
    loop decodes the Python loop's tokens through a SpecFold-compiled model at tau > 0, and the masks fold."""
    from specfold_compile.ops.fold_masks import forced_fold_masks, recorded_fold_masks
    from specfold_compile.testing import ModelSpec, gates_per_call

    model = ModelSpec(family="fast-dllm-v2", layers=2, block=8, seed=7).build()
    prompt = torch.tensor([1, 5, 9, 2, 7, 3])
    kwargs = dict(mode="spiffy", max_new_tokens=16, draft_budget=6, stop_at_eos=False, threshold=0.3)
    options = {"tau": 0.5, "kernels": "torch"}
    gen = torch.Generator().manual_seed(seed)
    masks = torch.rand(gates_per_call(model, options), 7, 8, generator=gen) < share
    compiled = torch.compile(model, backend="specfold", options=options)
    with forced_fold_masks(masks), recorded_fold_masks() as seen:
        host = generate(compiled, prompt, **kwargs)
        device = generate(compiled, prompt, loop="device", **kwargs)
    assert device.tokens == host.tokens and device.nfe == host.nfe and calls(device) == calls(host)
    assert seen and all(torch.equal(m, masks[g, :m.shape[0]] & _foldable(m)) for g, m in seen)
    assert any(m.any() for _, m in seen)


def _foldable(mask):
    """Row 0 never folds (the main branch); the drafts' rows may."""
    keep = torch.ones_like(mask)
    keep[0] = False
    return keep
