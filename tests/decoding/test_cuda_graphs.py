"""CUDA graphs in the decode loop: the static prefix cache and ``VerifyGraphs``' bookkeeping.

On the CPU the graphs are replayed eagerly (``replay="eager"``): the same static cache, input buffers,
padded logit positions and one entry per shape, the model called again where a GPU replays the capture.
The capture itself needs a CUDA device (the benchmarks' decode-loop suite runs it)."""

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specfold_compile.decoding import VerifyGraphs, generate, logit_rows_bucket
from specfold_compile.models import build

PROMPTS = [[5, 6, 7, 8, 9], [2, 90, 17, 33, 4, 61, 12]]


@contextlib.contextmanager
def _counted_static_writes(model):
    """``model``'s compiled ``append_block_static`` (what ``write_block(compiled=True)`` calls) compiled
    with aot_eager under a compile counter, which the block yields; removed again after it."""
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    model.__dict__["_compiled_methods"] = {
        "append_block_static": torch.compile(model.append_block_static, backend=counter)}
    try:
        yield counter
    finally:
        model.__dict__.pop("_compiled_methods", None)
        torch._dynamo.reset()


def _junk_beyond_length(cache, seed):
    """Fill a static cache's unused capacity with random values: nothing may read them."""
    g = torch.Generator().manual_seed(seed)
    for buf in (*cache.keys, *cache.values):
        buf[:, cache.length:] = torch.randn(buf[:, cache.length:].shape, generator=g)


def test_logit_rows_bucket():
    assert [logit_rows_bucket(m, 544) for m in (1, 16, 17, 100, 256, 257, 544)] == [16, 16, 32, 128, 256, 512, 544]
    assert logit_rows_bucket(5, 8) == 8  # never above N * B
    for m in range(1, 289):
        b = logit_rows_bucket(m, 288)
        assert m <= b <= 288 and (b == 288 or b <= max(16, 2 * m))
    with pytest.raises(ValueError, match="m: expected"):
        logit_rows_bucket(0, 32)
    with pytest.raises(ValueError, match="m: expected"):
        logit_rows_bucket(33, 32)


def test_static_cache_verify_and_writes_match_the_dynamic_cache(model):
    """The verification forward on a static cache (junk in its spare capacity) gives the dynamic cache's
    logits, block after block; block writes fill the buffers in place."""
    g = torch.Generator().manual_seed(1)
    B, V = model.config.block_size, model.config.vocab_size
    dyn = model.prefill(torch.randint(0, V, (9,), generator=g))
    static = model.static_cache(dyn, capacity=9 + 3 * B + 5)
    buffers = [t.data_ptr() for t in (*static.keys, *static.values)]
    for block in range(3):
        _junk_beyond_length(static, block)
        assert static.length == dyn.length and int(static.device_length) == dyn.length
        tokens = torch.randint(0, V, (4, B), generator=g)
        parents = torch.tensor([-1, 0, 0, 1])
        positions = torch.randperm(4 * B, generator=g)[:37]
        torch.testing.assert_close(model(tokens, parents, static, logit_positions=positions),
                                   model(tokens, parents, dyn, logit_positions=positions))
        torch.testing.assert_close(model(tokens, parents, static), model(tokens, parents, dyn))
        written = torch.randint(0, V, (B,), generator=g)
        dyn = model.write_block(dyn, written)
        assert model.write_block(static, written) is static
        torch.testing.assert_close(static.next_logits, dyn.next_logits)
        for buf, ref in zip((*static.keys, *static.values), (*dyn.keys, *dyn.values)):
            torch.testing.assert_close(buf[:, :dyn.length], ref)
    assert [t.data_ptr() for t in (*static.keys, *static.values)] == buffers


def test_static_cache_errors(model):
    B, V = model.config.block_size, model.config.vocab_size
    dyn = model.prefill(torch.arange(5) % V)
    with pytest.raises(ValueError, match="capacity"):
        model.static_cache(dyn, capacity=4)
    with pytest.raises(ValueError, match="capacity"):
        model.static_cache(dyn)
    static = model.static_cache(dyn, capacity=5 + B - 1)
    with pytest.raises(ValueError, match="capacity"):
        model.write_block(static, torch.zeros(B, dtype=torch.long))
    with pytest.raises(TypeError, match="out"):
        model.static_cache(dyn, out=dyn)
    other = build("tiny-nld" if model.config.family != "nld" else "tiny-fast-dllm-v2", seed=0)
    with pytest.raises(TypeError, match="cache"):
        model.static_cache(other.prefill(torch.arange(3)), capacity=8)


@pytest.mark.parametrize("all_logits", [False, True])
def test_generate_with_graphs_matches_launched_calls(model, all_logits):
    """Same tokens, forwards and accepted drafts as launched calls; one entry per (N, padded M), reused
    from prompt to prompt while the static cache is large enough."""
    graphs = VerifyGraphs(model, replay="eager")
    seen = 0
    for i, p in enumerate(PROMPTS):
        p = torch.tensor(p)
        for threshold in (0.9, 0.5):
            kw = dict(mode="spiffy", max_new_tokens=48, threshold=threshold, draft_budget=8, all_logits=all_logits)
            ref = generate(model, p, **kw)
            out = generate(model, p, cuda_graphs=graphs, **kw)
            assert out.tokens == ref.tokens and out.nfe == ref.nfe
            assert [s.accepted for s in out.steps] == [s.accepted for s in ref.steps]
            assert out.graph_captures + out.graph_replays == out.num_calls
            seen += out.num_calls
    assert graphs.captures == len(graphs.graphs) and graphs.captures + graphs.replays == seen
    assert graphs.replays > graphs.captures  # shapes recur
    # one block write graph (block length, family's causality, eager writes, no fused next block), replayed
    # for every later write (the cache's 256 keys are one window: VerifyGraphs' smallest window is
    # CAPACITY_STEP keys)
    assert list(graphs.write_graphs) == [(model.config.block_size, model.config.family == "nld", False, False, 256)]
    assert graphs.write_captures == 1 and graphs.write_replays >= 1
    if all_logits:
        assert all(m is None for _, m, _ in graphs.graphs)
    assert graphs.cache.capacity == 257  # the longest prefix written (< 7 + 48), rounded up to CAPACITY_STEP, + 1


def test_static_writes_compile_once_for_every_prefix_length(model):
    """write_block(compiled=True) on a static cache: one graph for every prefix length (its shapes depend
    on the capacity only), the same K/V and seed logits as the eager static write."""
    B, V = model.config.block_size, model.config.vocab_size
    g = torch.Generator().manual_seed(3)
    with _counted_static_writes(model) as counter:
        with torch.inference_mode():
            for n in (3, 11):
                dyn = model.prefill(torch.randint(0, V, (n,), generator=g))
                eager, comp = (model.static_cache(dyn, capacity=64) for _ in range(2))
                for _ in range(2):
                    block = torch.randint(0, V, (B,), generator=g)
                    model.write_block(eager, block)
                    assert model.write_block(comp, block, compiled=True) is comp
                    assert comp.length == eager.length and int(comp.device_length) == comp.length
                    torch.testing.assert_close(comp.next_logits, eager.next_logits)
                    for a, b in zip((*comp.keys, *comp.values), (*eager.keys, *eager.values)):
                        torch.testing.assert_close(a[:, :comp.length], b[:, :comp.length])
        assert counter.frame_count == 1, counter.frame_count


def test_replayed_writes_match_launched_writes(model):
    """VerifyGraphs.write_block (replay bookkeeping, eager on the CPU) against model.write_block on a
    static cache and on the dynamic one; capture_writes=False decodes the same tokens."""
    B, V = model.config.block_size, model.config.vocab_size
    g = torch.Generator().manual_seed(4)
    graphs = VerifyGraphs(model, replay="eager")
    dyn = model.prefill(torch.randint(0, V, (6,), generator=g))
    static = graphs.attach(dyn, 6 + 3 * B)
    for _ in range(3):
        block = torch.randint(0, V, (B,), generator=g)
        dyn = model.write_block(dyn, block)
        assert graphs.write_block(static, block) is static
        assert static.length == dyn.length and int(static.device_length) == dyn.length
        torch.testing.assert_close(static.next_logits, dyn.next_logits)
        for a, b in zip((*static.keys, *static.values), (*dyn.keys, *dyn.values)):
            torch.testing.assert_close(a[:, :dyn.length], b)
    assert (graphs.write_captures, graphs.write_replays) == (1, 2)
    with pytest.raises(ValueError, match="capacity"):  # the host checks run before the replay
        graphs.write_block(static, torch.zeros(static.capacity, dtype=torch.long))
    with pytest.raises(ValueError, match="attach"):
        graphs.write_block(dyn, block)
    p = torch.tensor(PROMPTS[1])
    kw = dict(mode="spiffy", max_new_tokens=48, draft_budget=8)
    launched = VerifyGraphs(model, replay="eager", capture_writes=False)
    assert generate(model, p, cuda_graphs=launched, **kw).tokens == generate(model, p, **kw).tokens
    assert launched.write_captures == 0 and not launched.write_graphs


def test_graphs_kept_while_the_cache_is_large_enough(model):
    graphs = VerifyGraphs(model, replay="eager")
    p = torch.tensor(PROMPTS[0])
    generate(model, p, mode="spiffy", max_new_tokens=32, cuda_graphs=graphs)
    cache, captured = graphs.cache, dict(graphs.graphs)
    again = generate(model, p, mode="spiffy", max_new_tokens=32, cuda_graphs=graphs)
    assert graphs.cache is cache and again.graph_captures == 0 and graphs.graphs == captured
    big = generate(model, p, mode="spiffy", max_new_tokens=300, cuda_graphs=graphs, stop_at_eos=False)
    assert graphs.cache is not cache and graphs.cache.capacity == 513 and big.graph_captures >= 1


def test_cuda_graphs_bad_inputs(model):
    p = torch.tensor(PROMPTS[0])
    with pytest.raises(TypeError, match="cuda_graphs"):
        generate(model, p, cuda_graphs="yes")
    with pytest.raises(ValueError, match="cuda_graphs: CUDA graphs need"):
        generate(model, p, cuda_graphs=True)  # a CPU model: only replay="eager" runs here
    with pytest.raises(ValueError, match="another model"):
        generate(model, p, cuda_graphs=VerifyGraphs(build("tiny-nld", seed=1), replay="eager"))
    with pytest.raises(ValueError, match="another model"):  # the same module, compiled: another target
        generate(torch.compile(model), p, cuda_graphs=VerifyGraphs(model, replay="eager"))
    with pytest.raises(ValueError, match="replay"):
        VerifyGraphs(model, replay="graph")
    with pytest.raises(TypeError, match="capture_writes"):
        VerifyGraphs(model, capture_writes=1)
    for bad in (1, True, 16.0):
        with pytest.raises(ValueError, match="windows: expected None or an int >= 2"):
            VerifyGraphs(model, windows=bad)
    graphs = VerifyGraphs(model, replay="eager")
    with pytest.raises(ValueError, match="attach"):
        graphs(torch.zeros(1, model.config.block_size, dtype=torch.long), torch.tensor([-1]), model.prefill(p), None)


def test_window_keys(model):
    """Windows double from ``windows`` keys up to the capacity asked for; the spare key is never in one."""
    graphs = VerifyGraphs(model, replay="eager", windows=64)
    graphs.attach(model.prefill(torch.tensor(PROMPTS[0])), 300)
    assert graphs.cache.capacity == 513  # 300 keys rounded up to CAPACITY_STEP, plus the spare key
    assert [graphs.window_keys(n) for n in (1, 64, 65, 128, 129, 300, 511, 512, 513)] == \
        [64, 64, 128, 128, 256, 512, 512, 512, 513]
    graphs.windows = None  # the bisect switch: the whole buffers
    assert {graphs.window_keys(n) for n in (1, 300, 512)} == {513}


@pytest.mark.parametrize("windows", [16, None])
def test_windows_decode_the_same_tokens(model, windows):
    """Calls and block writes through attention windows (views of the cache's first keys, same storage)
    give launched calls' tokens; each window has its own graphs."""
    graphs = VerifyGraphs(model, replay="eager", windows=windows)
    p = torch.tensor(PROMPTS[1])
    kw = dict(mode="spiffy", max_new_tokens=120, threshold=0.5, draft_budget=8, stop_at_eos=False)
    out = generate(model, p, cuda_graphs=graphs, **kw)
    assert out.tokens == generate(model, p, **kw).tokens
    used = sorted({w for *_, w in graphs.graphs})
    used_by_writes = sorted({w for *_, w in graphs.write_graphs})
    if windows is None:
        assert used == used_by_writes == [graphs.cache.capacity]
        return
    assert used == [16, 32, 64, 128] and len(used_by_writes) >= 2 and set(used_by_writes) <= set(used)
    for s, *_, w in graphs.write_graphs:  # a write's window holds the block it writes too
        assert w >= s
    for w, view in graphs._windows.items():
        for k, buf in zip((*view.keys, *view.values), (*graphs.cache.keys, *graphs.cache.values)):
            assert k.shape[1] == w and k.data_ptr() == buf.data_ptr() and k.stride() == buf.stride()
        assert view.device_length is graphs.cache.device_length


def test_windows_share_the_compiled_graphs():
    """A compiled model traces the windows' key length as dynamic and every window as a strided view
    (the spare key): as many Dynamo graphs with windows as without."""
    from torch._dynamo.utils import counters

    from specfold_compile.backend import specfold_backend

    model = build("tiny-fast-dllm-v2", seed=0)
    p = torch.tensor(PROMPTS[0])
    graphs_made = {}
    for windows in (None, 16):
        torch._dynamo.reset()
        counters.clear()
        target = torch.compile(model, backend=specfold_backend, options={"tau": 0.1, "kernels": "torch"})
        graphs = VerifyGraphs(target, replay="eager", windows=windows)
        with torch.inference_mode():
            generate(target, p, mode="spiffy", max_new_tokens=120, threshold=0.5, draft_budget=8,
                     stop_at_eos=False, cuda_graphs=graphs)
        graphs_made[windows] = int(counters["stats"]["unique_graphs"])
        assert len({w for *_, w in graphs.graphs}) == (1 if windows is None else 4)
    torch._dynamo.reset()
    assert graphs_made[16] == graphs_made[None], graphs_made


def test_compiled_writes_through_windows(model):
    """write_block(compiled=True) through windows: the compiled append_block_static mutates strided views
    of the buffers in place (aot_eager here: Dynamo and AOT's functionalization, as under Inductor), with
    the eager write's K/V and seed logits, and one compile for every window."""
    B, V = model.config.block_size, model.config.vocab_size
    g = torch.Generator().manual_seed(5)
    with _counted_static_writes(model) as counter:
        dyn = model.prefill(torch.randint(0, V, (5,), generator=g))
        graphs = VerifyGraphs(model, replay="eager", windows=16)
        static = graphs.attach(dyn, 5 + 4 * B)
        with torch.inference_mode():
            for _ in range(4):
                block = torch.randint(0, V, (B,), generator=g)
                dyn = model.write_block(dyn, block)
                assert graphs.write_block(static, block, compiled=True) is static
                torch.testing.assert_close(static.next_logits, dyn.next_logits)
                for a, b in zip((*static.keys, *static.values), (*dyn.keys, *dyn.values)):
                    torch.testing.assert_close(a[:, :dyn.length], b)
        assert len({w for *_, w in graphs.write_graphs}) >= 3
        assert counter.frame_count == 1, counter.frame_count


@settings(max_examples=200, deadline=None)
@given(windows=st.integers(2, 300), allocated=st.integers(2, 5000), data=st.data())
def test_window_keys_is_the_smallest_doubling_that_holds_the_keys(windows, allocated, data):
    """For any smallest window and cache: the window holds the keys read, is ``windows`` x 2^k or the
    capacity asked for (the buffers less their spare key), and half of it would not hold them."""
    from types import SimpleNamespace

    graphs = VerifyGraphs(torch.nn.Identity(), replay="eager", windows=windows)
    graphs.cache = SimpleNamespace(capacity=allocated)
    needed = data.draw(st.integers(1, allocated))
    w = graphs.window_keys(needed)
    if needed >= allocated:  # only a call reading the spare key too gets the whole buffers
        assert w == allocated
        return
    assert needed <= w <= allocated - 1
    smallest_doubling = windows << max(0, (-(-needed // windows) - 1).bit_length())
    assert smallest_doubling >= needed and (smallest_doubling == windows or smallest_doubling // 2 < needed)
    assert w == min(smallest_doubling, allocated - 1)


def test_launched_writes_go_through_windows(model, monkeypatch):
    """capture_writes=False: generate launches its block writes, in place, through the same windows as
    the replayed ones (each write reads the smallest window holding its prefix and block)."""
    seen = []
    original = model.append_block_static

    def spy(keys, values, device_length, block_tokens, causal, next_block=None):
        seen.append((keys[0].shape[1], int(device_length) + block_tokens.shape[0]))
        return original(keys, values, device_length, block_tokens, causal, next_block)

    monkeypatch.setattr(model, "append_block_static", spy)
    p = torch.tensor(PROMPTS[1])
    kw = dict(mode="spiffy", max_new_tokens=120, threshold=0.5, draft_budget=8, stop_at_eos=False)
    graphs = VerifyGraphs(model, replay="eager", capture_writes=False, windows=16)
    assert generate(model, p, cuda_graphs=graphs, **kw).tokens == generate(model, p, **kw).tokens
    assert graphs.write_captures == 0 and not graphs.write_graphs and len(seen) >= 3
    assert all(w == graphs.window_keys(needed) and needed <= w < graphs.cache.capacity - 1 for w, needed in seen)
