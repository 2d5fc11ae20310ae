"""Which calls fold (``options["fold_min_branches"]`` and the cost model): the plain graph runs below the
threshold, the folded one at and above it, from one Dynamo graph of dynamic N."""
import pytest
import torch
import torch._dynamo

from specfold_compile.testing import ModelSpec, assert_close, capture_graph, make_cache, make_tree
from specfold_compile.backend import (SpecFoldBackend, SpecFoldSettings, collect_stats, compile_graph, dispatch,
                                      run_passes)
from specfold_compile.backend.settings import Tuning
from specfold_compile.ops import fold_ops, stats
from specfold_compile.decoding import mark_dynamic_shapes
from specfold_compile.reference import folded_verify


@pytest.fixture(scope="module")
def model_cache():
    model = ModelSpec(family="fast-dllm-v2", layers=2, seed=3).build()
    return model, make_cache(model, seed=5)


def _calls(compiled, model, cache, ns, tau):
    """Run each N (marked dynamic), checking each output against what should have run."""
    for n_rows in ns:
        tokens, parents = make_tree(model, n_rows, "realistic", n_rows)
        mark_dynamic_shapes(tokens, parents, cache)
        with collect_stats() as s:
            out = compiled(tokens, parents, cache)
        yield n_rows, s
        if s.calls:  # folded: the reference with the gates' own decisions
            ref, _ = folded_verify(model, tokens, parents, cache, tau, fold_masks=s.fold_masks)
        else:  # plain: the model itself
            with torch.no_grad():
                ref = model.verify(tokens, parents, cache)
        assert_close(out, ref, what=f"N={n_rows}")


@pytest.mark.parametrize("inductor", [False, True], ids=["fx", "inductor"])
def test_fold_min_branches_picks_plain_or_folded_per_call(model_cache, inductor):
    if inductor:
        pytest.importorskip("torch._inductor")
    model, cache = model_cache
    backend = SpecFoldBackend(tau=0.3, fold_min_branches=5, kernels="torch", inductor=inductor)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    seen = {}
    for n_rows, s in _calls(compiled, model, cache, (3, 6, 4, 5), 0.3):
        seen[n_rows] = (s.calls, s.plain_calls, len(s.fold_masks))
    assert seen == {3: (0, 1, 0), 4: (0, 1, 0), 5: (1, 0, 2), 6: (1, 0, 2)}, seen
    assert len(backend.graphs) == 1, "one Dynamo graph serves both variants"
    plan = backend.graphs[0].fold_plan
    assert plan.variants == "both" and plan.n_input is not None


def test_static_n_below_threshold_is_not_rewritten(model_cache, tmp_path):
    model, _ = model_cache
    cache = make_cache(model, seed=6)  # not marked dynamic: static shapes, real example inputs
    tokens, parents = make_tree(model, 3, "realistic", 1)
    gm, inputs = capture_graph(model, tokens, parents, cache)
    rewrite = run_passes(gm, SpecFoldSettings(tau=0.3, fold_min_branches=4, dump_dir=str(tmp_path)))
    out = rewrite.gm
    targets = [n.target for n in out.graph.nodes if n.op == "call_function"]
    assert fold_ops.FOLD_GATE not in targets and fold_ops.PACKED_LINEAR not in targets
    assert rewrite.fold_plan.variants == "plain"
    report = (tmp_path / "graph_00" / "regions.txt").read_text()
    assert "fold_min_branches=4" in report and "N = 3 (static): not folded" in report
    with torch.no_grad():
        got = out(*inputs)
        assert_close(got[0] if isinstance(got, (tuple, list)) else got, model.verify(tokens, parents, cache),
                     tol=1e-6, what="plain graph")
    # at or above the threshold the same graph folds
    gm, _ = capture_graph(model, tokens, parents, cache)
    out = compile_graph(gm, SpecFoldSettings(tau=0.3, fold_min_branches=3))
    assert [n.target for n in out.graph.nodes].count(fold_ops.FOLD_GATE) == 2


def _cost_model_plan(model, cache, monkeypatch, overhead_us, **options):
    """The cost model's plan for a dynamic-N graph, as on CUDA with Triton kernels."""
    monkeypatch.setattr(dispatch, "_cost_model_applies", lambda impl, device: True)
    tokens, parents = make_tree(model, 3, "realistic", 2)
    cache = make_cache(model, seed=7)
    mark_dynamic_shapes(tokens, parents, cache)
    gm, _ = capture_graph(model, tokens, parents, cache)
    return run_passes(gm, SpecFoldSettings(tau=0.3, kernels="triton",
                                           tuning=Tuning(fold_overhead_us=overhead_us, **options))).fold_plan


def test_cost_model_never_folds_a_tiny_model(model_cache, monkeypatch):
    model, cache = model_cache
    plan = _cost_model_plan(model, cache, monkeypatch, Tuning().fold_overhead_us)
    assert plan.variants == "plain" and not any(plan.decisions.values())
    assert "cost model" in plan.description


def test_cost_model_folds_only_where_it_pays(model_cache, monkeypatch):
    """With no fixed cost (and no spill skipping, which gives cuBLAS every row of these small weights),
    folding pays once the dense linears are compute-bound (past the ridge)."""
    model, cache = model_cache
    plan = _cost_model_plan(model, cache, monkeypatch, 0.0, min_spill_us=0.0)
    block = model.config.block_size
    assert plan.variants == "both"
    for n, folds in plan.decisions.items():
        shapes = [(lin.weight.shape[0], lin.weight.shape[1]) for lin in model.modules()
                  if isinstance(lin, torch.nn.Linear) and lin is not getattr(model, "lm_head", None)]
        assert folds == (fold_ops.fold_saving_us(n * block, shapes, 0.45, 0.0, 4) > 0), n
    assert not plan.decisions[2] and plan.decisions[128]


@pytest.mark.parametrize("shape, folds_at, not_at", [
    ("fast-dllm-v2-1.5b", 17, 9), ("fast-dllm-v2-7b", 9, 5), ("nld-3b", 9, 5),
])
def test_cost_model_matches_the_measured_crossovers(shape, folds_at, not_at):
    """H200 (docs/results.md "Which calls fold"): SpecFold beat dense under Inductor at ``folds_at`` branches
    and lost at ``not_at``; the estimate must decide the same way."""
    from specfold_compile.models.config import PRESETS

    cfg = PRESETS[shape]
    shapes = cfg.packed_linear_shapes() * cfg.num_layers
    defaults = SpecFoldSettings()
    pays = lambda n: dispatch.cost_model_folds(n, cfg.block_size, shapes, cfg.num_layers, defaults)  # noqa: E731
    assert pays(folds_at) and not pays(not_at)
    # bandwidth-bound (every row reads the same weights): no saving at all
    assert fold_ops.fold_saving_us(4 * cfg.block_size, shapes, defaults.dense_fraction, defaults.min_spill_us) == 0.0


def test_launched_calls_run_plain_unless_captured_or_first(monkeypatch):
    """With launched_plain, a call the plan folds runs the folded graph when it is being captured or inside
    fold_launched_calls(), else the plain one; the first launched call at an N whose folded graph has not
    run also runs it once (unrecorded, result dropped) to warm it for a capture."""
    ran = []

    def folded(x):
        stats.record_gate(0, torch.zeros(2, 2, dtype=torch.bool), torch.tensor([-1, 0]))
        ran.append("folded")
        return "folded"

    plan = dispatch.FoldPlan(lambda b: b >= 4, "both", n_input=0, launched_plain=True)
    fd = dispatch.FoldDispatch(folded, lambda x: ran.append("plain") or "plain", plan)
    capturing = [False]
    monkeypatch.setattr(dispatch, "capturing", lambda: capturing[0])
    rows = lambda n: torch.zeros(n, 2)  # noqa: E731  (input 0 carries N)
    with collect_stats() as s:
        assert [fd(rows(n)) for n in (5, 5, 3, 5, 6)] == ["plain"] * 5
    assert ran == ["folded", "plain", "plain", "plain", "plain", "folded", "plain"]  # warm-ups at 5 and 6
    assert (s.calls, s.plain_calls, s.launched_plain_calls) == (0, 5, 4)  # warm-ups are not recorded
    ran.clear()
    capturing[0] = True
    assert (fd(rows(5)), fd(rows(3))) == ("folded", "plain")
    capturing[0] = False
    with dispatch.fold_launched_calls(), collect_stats() as s:
        assert fd(rows(7)) == "folded"
    assert fd(rows(7)) == "plain" and s.calls == 1
    assert ran == ["folded", "plain", "folded", "plain"]  # 7 was warmed by the forced call
    # a plan without launched_plain (fold_launched=True, or no cost model) folds launched calls too
    ran.clear()
    fd = dispatch.FoldDispatch(folded, lambda x: ran.append("plain"), dispatch.FoldPlan(lambda b: b >= 4, "both", n_input=0))
    for n in (5, 5, 3):
        fd(rows(n))
    assert ran == ["folded", "folded", "plain"]


def test_cost_model_plans_plain_launched_calls(model_cache, monkeypatch):
    """The cost model's plan compiles the plain graph for launched calls even where every N folds
    (fold_launched=False), and not with fold_launched=True; the report says which."""
    model, cache = model_cache
    monkeypatch.setattr(dispatch, "cost_model_folds", lambda n, *args, **kwargs: True)  # every N pays
    plan = _cost_model_plan(model, cache, monkeypatch, 0.0)
    assert all(plan.decisions.values()) and plan.variants == "both" and plan.launched_plain
    assert "launched calls" in plan.description and "every N folds" in plan.description
    plan = _cost_model_plan(model, cache, monkeypatch, 0.0, fold_launched=True)
    assert plan.variants == "folded" and not plan.launched_plain
    # fold_min_branches bypasses the cost model: launched calls fold as asked
    plan = _cost_model_plan(model, cache, monkeypatch, 0.0, fold_min_branches=2)
    assert plan.variants == "folded" and not plan.launched_plain
    with pytest.raises(TypeError, match="fold_launched"):
        SpecFoldSettings(fold_launched="yes")


def test_launched_calls_through_torch_compile(model_cache, monkeypatch):
    """End to end on the CPU with the cost model forced on (it applies to Triton on CUDA): launched calls
    return the plain graph's output (the first at an N warms the folded graph, unrecorded),
    fold_launched_calls() folds; every output is right for what ran."""
    model, cache = model_cache
    monkeypatch.setattr(dispatch, "_cost_model_applies", lambda impl, device: True)
    monkeypatch.setattr(dispatch, "cost_model_folds", lambda n, *args, **kwargs: n >= 3)
    backend = SpecFoldBackend(tau=0.3, kernels="torch")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    seen = []
    for n_rows, s in _calls(compiled, model, cache, (4, 4), 0.3):
        seen.append((s.calls, s.plain_calls, s.launched_plain_calls))
    with dispatch.fold_launched_calls():
        for n_rows, s in _calls(compiled, model, cache, (4,), 0.3):
            seen.append((s.calls, s.plain_calls, s.launched_plain_calls))
    assert seen == [(0, 1, 1), (0, 1, 1), (1, 0, 0)], seen
    assert backend.graphs[0].fold_plan.launched_plain


def test_static_n_graph_keeps_a_plain_graph_for_launched_calls(model_cache, monkeypatch):
    """A static-N graph the cost model folds compiles the plain graph too (launched calls run it, the
    result equal to the model's); forced, the same dispatcher folds."""
    from specfold_compile.backend import specfold_backend

    model, _ = model_cache
    monkeypatch.setattr(dispatch, "_cost_model_applies", lambda impl, device: True)
    monkeypatch.setattr(dispatch, "cost_model_folds", lambda n, *args, **kwargs: True)
    cache = make_cache(model, seed=6)  # not marked dynamic: N = 3 static
    tokens, parents = make_tree(model, 3, "realistic", 1)
    gm, inputs = capture_graph(model, tokens, parents, cache)
    run = specfold_backend(gm, inputs, options={"tau": 0.3, "kernels": "torch"})
    plan = run.plan
    assert isinstance(run, dispatch.FoldDispatch) and plan.variants == "both" and plan.static_n == 3
    assert plan.launched_plain and "launched calls" in plan.description
    first = lambda out: out[0] if isinstance(out, (tuple, list)) else out  # noqa: E731
    with torch.no_grad(), collect_stats() as s:
        got = first(run(*inputs))
    assert (s.calls, s.plain_calls, s.launched_plain_calls) == (0, 1, 1) and run.warm == {3}
    assert_close(got, model.verify(tokens, parents, cache), tol=1e-6, what="launched: plain graph")
    with torch.no_grad(), collect_stats() as s, dispatch.fold_launched_calls():
        got = first(run(*inputs))
    ref, _ = folded_verify(model, tokens, parents, cache, 0.3, fold_masks=s.fold_masks)
    assert s.calls == 1
    assert_close(got, ref, what="forced: folded graph")
