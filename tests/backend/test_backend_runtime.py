"""Runtime behaviour of the compiled model: dynamic N, tau changes, statistics, Triton kernels, retracing."""
import math

import pytest
import torch
import torch._dynamo
from torch.fx.experimental.proxy_tensor import make_fx

from specfold_compile.testing import (ModelSpec, assert_close, capture_graph, chain_lengths_of, compile_run,
                                      make_cache, make_tree, rel_err)
from specfold_compile.backend import SpecFoldBackend, SpecFoldSettings, collect_stats, compile_graph
from specfold_compile.ops import fold_ops
from specfold_compile.reference import folded_verify


@pytest.fixture(scope="module")
def model_cache():
    model = ModelSpec(family="nld", layers=2, seed=2).build()
    return model, make_cache(model, seed=4)


# --- dynamic N and tau -----------------------------------------------------------------------------

def test_dynamic_n_recompiles_at_most_once(model_cache):
    model, cache = model_cache
    backend = SpecFoldBackend(tau=0.3)
    compiled = torch.compile(model, backend=backend)
    for n_rows in (3, 5, 7, 9):
        tokens, parents = make_tree(model, n_rows, "realistic", n_rows)
        with collect_stats() as s:
            out = compiled(tokens, parents, cache)
        assert len(s.fold_masks) == 2, "the folded graph must run for every N"
        ref, _ = folded_verify(model, tokens, parents, cache, 0.3, fold_masks=s.fold_masks)
        assert_close(out, ref, what=f"N={n_rows}")
    assert 1 <= len(backend.graphs) <= 2, f"{len(backend.graphs)} graphs compiled for N = 3, 5, 7, 9"


def test_marked_dynamic_n_and_prefix_compile_one_graph(model_cache):
    """What generate() and bench.run do: with N and the prefix length marked dynamic up front, new
    branch counts and a longer prefix reuse the first N > 1 graph."""
    from specfold_compile.decoding import mark_dynamic_shapes

    model, _ = model_cache
    backend = SpecFoldBackend(tau=0.3)
    compiled = torch.compile(model, backend=backend)
    for n_rows, prompt_len in ((3, 7), (5, 7), (9, 23), (4, 40)):
        cache = make_cache(model, prompt_len=prompt_len)
        tokens, parents = make_tree(model, n_rows, "realistic", n_rows)
        mark_dynamic_shapes(tokens, parents, cache)
        with collect_stats() as s:
            compiled(tokens, parents, cache)
        assert s.calls == 1
    assert len(backend.graphs) == 1, f"{len(backend.graphs)} graphs compiled"


def test_dynamic_n_unique_graphs_counter(model_cache):
    from torch._dynamo.utils import counters

    model, cache = model_cache
    compiled = torch.compile(model, backend="specfold", options={"tau": 0.3})
    before = counters["stats"]["unique_graphs"]
    for n_rows in (3, 5, 7, 9):
        compiled(*make_tree(model, n_rows, "random", n_rows), cache)
    assert counters["stats"]["unique_graphs"] - before <= 2


def test_growing_prefix_cache(model_cache):
    """Decoding appends blocks to the prefix: the compiled model follows the cache length (positions, RoPE,
    query scaling past position 64) with at most one recompilation."""
    model, cache = model_cache
    backend = SpecFoldBackend(tau=0.3)
    compiled = torch.compile(model, backend=backend)
    tokens, parents = make_tree(model, 5, "realistic", 12)
    for _ in range(5):  # prefix 7, 23, 39, 55, 71: the last two blocks straddle / pass position 64
        with collect_stats() as s:
            out = compiled(tokens, parents, cache)
        ref, _ = folded_verify(model, tokens, parents, cache, 0.3, fold_masks=s.fold_masks)
        assert_close(out, ref, what=f"prefix length {cache.length}")
        cache = model.write_block(cache, tokens[0].clone().masked_fill_(tokens[0] == 100, 3))
    assert len(backend.graphs) <= 2


def test_new_tau_never_stale(model_cache):
    model, cache = model_cache
    tokens, parents = make_tree(model, 6, "realistic", 1)
    dense = model(tokens, parents, cache)
    c0 = torch.compile(model, backend="specfold", options={"tau": 0.0})
    c5 = torch.compile(model, backend="specfold", options={"tau": 0.5})
    assert_close(c0(tokens, parents, cache), dense, what="tau=0")
    with collect_stats() as s:
        out5 = c5(tokens, parents, cache)
    assert s.folded_rows > 0
    assert rel_err(out5, dense, ord=2) > 1e-3, "tau=0.5 must fold and change the result"
    ref5, free_masks = folded_verify(model, tokens, parents, cache, 0.5, fold_masks=s.fold_masks)
    assert_close(out5, ref5, what="tau=0.5 vs reference")
    assert all(torch.equal(a, b) for a, b in zip(s.fold_masks, folded_verify(model, tokens, parents, cache, 0.5)[1]))
    # Both compiled models stay valid, in any order, and a third tau recompiles too.
    assert_close(c0(tokens, parents, cache), dense, what="tau=0 again")
    assert_close(c5(tokens, parents, cache), ref5, what="tau=0.5 again")
    with collect_stats() as s2:
        out2 = torch.compile(model, backend="specfold", options={"tau": 2.0})(tokens, parents, cache)
    assert s2.folded_rows > s.folded_rows
    assert_close(out2, folded_verify(model, tokens, parents, cache, 2.0, fold_masks=s2.fold_masks)[0])


def test_tau_is_one_graph_constant_read_by_every_gate(model_cache):
    model, cache = model_cache
    tokens, parents = make_tree(model, 3, "realistic", 2)
    gm, _ = capture_graph(model, tokens, parents, cache)
    gm = compile_graph(gm, SpecFoldSettings(tau=0.375))
    taus = [n for n in gm.graph.nodes if n.target is torch.full]
    assert len(taus) == 1 and taus[0].args == ((), 0.375) and taus[0].kwargs["dtype"] == torch.float32
    gates = [n for n in gm.graph.nodes if n.target is fold_ops.FOLD_GATE]
    assert gates and all(g.kwargs["tau"] is taus[0] for g in gates)


@pytest.mark.parametrize("gate", ["layer", "sublayer"])
def test_gate_flags_in_graph_puts_one_flags_computation_before_each_gate(model_cache, gate):
    """gate_flags="graph": every gate gets its flags from plain tensor ops placed right before it, fed
    by the same residual state; the default leaves the gate computing them (no flags argument)."""
    model, cache = model_cache
    tokens, parents = make_tree(model, 5, "realistic", 3)
    counted = {}
    for where in ("kernel", "graph"):
        gm, _ = capture_graph(model, tokens, parents, cache)  # the passes rewrite their input
        out = compile_graph(gm, SpecFoldSettings(tau=0.3, gate=gate, gate_flags=where))
        gates = [n for n in out.graph.nodes if n.target is fold_ops.FOLD_GATE]
        flags = [n for n in out.graph.nodes if n.target is fold_ops.fold_flags_graph]
        counted[where] = (len(gates), len(flags))
        if where == "graph":
            assert len(gates) == len(flags)
            assert all(g.kwargs["flags"] is f and f.kwargs["h"] is g.kwargs["h"] for g, f in zip(gates, flags))
        else:
            assert all("flags" not in g.kwargs and len(g.kwargs) == 6 for g in gates)
    layers = 2 * (2 if gate == "sublayer" else 1)
    assert counted == {"kernel": (layers, 0), "graph": (layers, layers)}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy scalar conversion inside the interpreter
@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_gate_flags_in_graph_gives_the_same_decisions_and_results(model_cache, kernels, monkeypatch):
    from specfold_compile import kernels as k

    if kernels == "triton" and not k.triton_available():
        pytest.skip("triton is not importable here (or neither CUDA nor TRITON_INTERPRET=1)")
    model, cache = model_cache
    tokens, parents = make_tree(model, 8, "realistic", 6)
    runs = {}
    for where in ("kernel", "graph"):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="specfold",
                                 options={"tau": 0.3, "gate_flags": where, "kernels": kernels})
        with collect_stats() as s:
            out = compiled(tokens, parents, cache)
        runs[where] = (out, s.fold_masks)
    (out_k, masks_k), (out_g, masks_g) = runs["kernel"], runs["graph"]
    assert len(masks_k) == len(masks_g) == 2
    assert all(torch.equal(a, b) for a, b in zip(masks_k, masks_g))
    assert any(m.any() for m in masks_g) and not any(m[0].any() for m in masks_g)
    assert_close(out_g, out_k, what="gate_flags=graph vs kernel")


# --- statistics ------------------------------------------------------------------------------------

@pytest.mark.parametrize("gate", ["layer", "sublayer"])
def test_stats_do_not_change_results_and_are_consistent(model_cache, gate):
    model, cache = model_cache
    tokens, parents = make_tree(model, 8, "realistic", 5)
    compiled = torch.compile(model, backend="specfold", options={"tau": 0.3, "gate": gate})
    plain = compiled(tokens, parents, cache)
    with collect_stats() as s:
        out = compiled(tokens, parents, cache)
    again = compiled(tokens, parents, cache)
    assert torch.equal(plain, out) and torch.equal(out, again)

    masks = s.fold_masks
    n_rows, block = tokens.shape
    assert len(masks) == len(s.layers) == 2 * (2 if gate == "sublayer" else 1)
    draft_rows = (n_rows - 1) * block
    computed = [draft_rows - int(m[1:].sum()) for m in masks]
    assert math.isclose(s.recompute_ratio, sum(computed) / (draft_rows * len(masks)))
    assert 0 < s.recompute_ratio < 1
    assert s.folded_rows == sum(int(m.sum()) for m in masks)
    total_chains: dict[int, int] = {}
    for m, layer, c in zip(masks, s.layers, computed):
        assert m.dtype == torch.bool and m.shape == (n_rows, block) and not m[0].any()
        assert layer.draft_rows == draft_rows and layer.computed_draft_rows == c
        assert layer.folded_rows == int(m.sum())
        assert math.isclose(layer.recompute_ratio, c / draft_rows)
        chains = chain_lengths_of(m, parents)
        assert layer.chain_lengths == chains
        assert sum(chains.values()) == layer.folded_rows
        for k, v in chains.items():
            total_chains[k] = total_chains.get(k, 0) + v
    assert s.chain_lengths == dict(sorted(total_chains.items()))
    assert max(s.chain_lengths) >= 2, "the realistic tree has grandchildren folding through their parent"
    assert s.calls == 1


def test_stats_accumulate_over_calls_and_keep_last_masks(model_cache):
    model, cache = model_cache
    compiled = torch.compile(model, backend="specfold", options={"tau": 0.3})
    t1, p1 = make_tree(model, 4, "realistic", 1)
    t2, p2 = make_tree(model, 6, "realistic", 2)
    with collect_stats() as s1:
        compiled(t1, p1, cache)
    with collect_stats() as s:
        compiled(t1, p1, cache)
        compiled(t2, p2, cache)
        with collect_stats() as inner:
            compiled(t2, p2, cache)
    assert s.calls == 3 and inner.calls == 1
    assert [m.shape for m in s.fold_masks] == [t2.shape] * 2
    assert all(torch.equal(a, b) for a, b in zip(s.fold_masks, inner.fold_masks))
    block = t1.shape[1]
    assert s.layers[0].draft_rows == (3 + 5 + 5) * block
    assert s.layers[0].folded_rows == s1.layers[0].folded_rows + 2 * inner.layers[0].folded_rows
    # Outside the context nothing is recorded.
    compiled(t1, p1, cache)
    assert s.calls == 3


def test_stats_single_branch(model_cache):
    model, cache = model_cache
    tokens, parents = make_tree(model, 1, "random", 0)
    _, s, compiled = compile_run(model, tokens, parents, cache, tau=0.3)  # checks that no gate ran
    assert math.isnan(s.recompute_ratio) and s.folded_rows == 0 and s.chain_lengths == {} and s.calls == 0


# --- Triton kernels (interpreter on CPU) -----------------------------------------------------------

@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy scalar conversion inside the interpreter
@pytest.mark.parametrize("dense_fraction, min_spill_us, one_pass",
                         [(0.0, 0.0, False), (0.3, 0.0, True), (1.0, 0.0, True), (0.3, 2.0, False)],
                         ids=["triton-gemm-two-kernels", "split-one-pass", "cublas-one-pass", "split-skipped-two-kernels"])
def test_triton_kernels_match_torch_kernels_and_reference(dense_fraction, min_spill_us, one_pass, monkeypatch):
    """The Triton kernels through the whole rewritten graph, packed linears in every split of cuBLAS head
    and Triton spill, attention in one pass and as prefix states + block merge (two kernels)."""
    from specfold_compile import kernels
    from specfold_compile.kernels import attention

    one_pass_calls = []
    launch = attention._launch_block_kernel

    def watched_launch(*a, **kw):  # the one-pass launch is the block kernel's with the prefix to walk
        if kw.get("prefix") is not None:
            one_pass_calls.append(1)
        return launch(*a, **kw)
    monkeypatch.setattr(attention, "_launch_block_kernel", watched_launch)

    # tiny shapes: let the cuBLAS/Triton split of the packed linears fall inside 24 rows
    if not kernels.triton_available():
        pytest.skip("triton is not importable here (or neither CUDA nor TRITON_INTERPRET=1)")
    model = ModelSpec(family="fast-dllm-v2", layers=1, hidden=32, head_dim=8, block=8, seed=6).build()
    cache = make_cache(model, prompt_len=3)
    tokens, parents = make_tree(model, 3, "realistic", 4)
    out_t, s_t, _ = compile_run(model, tokens, parents, cache, tau=0.3, kernels="torch")
    spills = []
    real_spill = kernels.packed_linear
    monkeypatch.setattr(kernels, "packed_linear", lambda *a, **k: spills.append(1) or real_spill(*a, **k))
    from specfold_compile.backend.settings import Tuning
    out_k, s_k, _ = compile_run(model, tokens, parents, cache, tau=0.3, kernels="triton", tuning=Tuning(
        dense_fraction=dense_fraction, min_spill_us=min_spill_us, dense_linear_min_rows=0, dense_linear_row_multiple=4,
        one_pass_max_prefix=1024 if one_pass else -1))
    # 1.0: cuBLAS on every row; min_spill_us: these tiny GEMMs cost far less than a spill launch
    assert (len(spills) == 0) == (dense_fraction == 1.0 or min_spill_us > 0)
    assert bool(one_pass_calls) == one_pass
    assert s_k.folded_rows > 0
    assert all(torch.equal(a, b) for a, b in zip(s_t.fold_masks, s_k.fold_masks))
    assert_close(out_k, out_t, what="triton vs torch kernels")
    ref, _ = folded_verify(model, tokens, parents, cache, 0.3, fold_masks=s_k.fold_masks)
    assert_close(out_k, ref, what="triton vs reference")


# --- retracing the rewritten graph -----------------------------------------------------------------

@pytest.mark.parametrize("tracing_mode", ["real", "fake"])
def test_rewritten_graph_can_be_retraced(model_cache, tracing_mode):
    model, cache = model_cache
    tokens, parents = make_tree(model, 5, "realistic", 8)
    gm, inputs = capture_graph(model, tokens, parents, cache)
    rewritten = compile_graph(gm, SpecFoldSettings(tau=0.3))
    with collect_stats() as s:
        expected = rewritten(*inputs)
    with torch.no_grad():
        # The tau buffer is module state, not an input: fake tracing sees it as a real constant.
        retraced = make_fx(rewritten, tracing_mode=tracing_mode,
                           _allow_non_fake_inputs=tracing_mode == "fake")(*inputs)
    targets = [n.target for n in retraced.graph.nodes if n.op == "call_function"]
    assert targets.count(fold_ops.FOLD_GATE) == 2
    assert targets.count(fold_ops.FOLDED_ATTENTION) == 2
    assert targets.count(fold_ops.PACKED_LINEAR) == 2 * 3  # qkv, gate_up and down in each of 2 layers
    with collect_stats() as s2:
        out = retraced(*inputs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    expected = expected[0] if isinstance(expected, (tuple, list)) else expected
    assert all(torch.equal(a, b) for a, b in zip(s.fold_masks, s2.fold_masks))
    assert_close(out, expected, tol=1e-6, what="retraced vs rewritten")
    ref, _ = folded_verify(model, tokens, parents, cache, 0.3, fold_masks=s.fold_masks)
    assert_close(out, ref, what="retraced vs reference")


def test_rewritten_graph_through_aot_eager(model_cache):
    model, cache = model_cache
    tokens, parents = make_tree(model, 4, "realistic", 9)
    gm, inputs = capture_graph(model, tokens, parents, cache)
    rewritten = compile_graph(gm, SpecFoldSettings(tau=0.3))
    expected = rewritten(*inputs)
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(rewritten, backend="aot_eager", fullgraph=True)(*inputs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    expected = expected[0] if isinstance(expected, (tuple, list)) else expected
    assert_close(out, expected, tol=1e-6, what="aot_eager on the rewritten graph")


# --- static prefix cache (CUDA-graph decode loops) -------------------------------------------------

@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy scalar conversion inside the interpreter
@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_static_cache_folds_like_the_dynamic_cache_without_recompiling(kernels, monkeypatch):
    """A static cache (fixed capacity, random values past its length, the length on the device) through
    the folded graph: the dynamic cache's results block after block, with the valid length reaching
    the attention op, and one graph for every block (the length is data, not a shape)."""
    from specfold_compile import kernels as kernel_mod

    if kernels == "triton" and not kernel_mod.triton_available():
        pytest.skip("triton is not importable here (or neither CUDA nor TRITON_INTERPRET=1)")
    model = ModelSpec(family="fast-dllm-v2", layers=1, hidden=32, head_dim=8, block=8, seed=3).build()
    dyn = make_cache(model, prompt_len=5, seed=1)
    static = model.static_cache(dyn, capacity=40)
    backend = SpecFoldBackend(tau=0.3, kernels=kernels)
    compiled = torch.compile(model, backend=backend)
    gen = torch.Generator().manual_seed(0)
    for block in range(3):
        for buf in (*static.keys, *static.values):  # junk past the length: nothing may read it
            buf[:, static.length:] = 100 * torch.randn(buf[:, static.length:].shape, generator=gen)
        tokens, parents = make_tree(model, 5, "realistic", block)
        with collect_stats() as s:
            out = compiled(tokens, parents, static)
        assert len(s.fold_masks) == 1
        ref, _ = folded_verify(model, tokens, parents, dyn, 0.3, fold_masks=s.fold_masks)
        assert_close(out, ref, what=f"block {block}, prefix length {dyn.length}")
        written = tokens[0].clone().masked_fill_(tokens[0] == model.config.mask_token_id, 3)
        dyn, static = model.write_block(dyn, written), model.write_block(static, written)
    assert len(backend.graphs) == 1, f"{len(backend.graphs)} graphs compiled for one static cache"
