import json
import random

import pytest

from bench.plot import (end_to_end_panels, main, merge_results, plot_breakdown, plot_end_to_end, plot_memory,
                        plot_per_check, plot_results)


def test_per_check_plot_writes_png(tmp_path):
    rows = [{"model": "m", "prefix": 512, "n_branches": n, "mode": mode, "ms": ms, "recompute_ratio": 1.0,
             "cuda_graph": True, **({"target_ratio": 0.25} if mode == "specfold" else {})}
            for n in (1, 5) for mode, ms in (("dense", 2.0 * n), ("floor", 1.0))] + \
           [{"model": "m", "prefix": 512, "n_branches": 5, "mode": "specfold", "ms": 3.0, "recompute_ratio": 0.2,
             "cuda_graph": True, "target_ratio": 0.25},
            # N = 1: what backend="specfold" runs with nothing to fold (no target ratio, not plotted)
            {"model": "m", "prefix": 512, "n_branches": 1, "mode": "specfold", "ms": 1.5, "recompute_ratio": 1.0,
             "cuda_graph": True}]
    path = tmp_path / "per_check.json"
    path.write_text(json.dumps({"rows": rows}))
    out = plot_per_check(path)
    assert out.exists() and out.stat().st_size > 1000


def test_merge_later_runs_replace_the_same_point(tmp_path):
    def run(path, rows, seconds):
        path.write_text(json.dumps({"versions": {"gpu": "x"}, "suite": "per_check", "seconds": seconds,
                                    "rows": rows}))
        return path

    row = {"model": "m", "prefix": 512, "n_branches": 17, "mode": "specfold", "target_ratio": 0.5}
    old = run(tmp_path / "old.json", [{**row, "ms": 9.0}, {**row, "n_branches": 5, "ms": 3.0},
                                      {**row, "mode": "dense", "target_ratio": None, "ms": 7.0}], 1)
    new = run(tmp_path / "new.json", [{**row, "ms": 6.9}, {**row, "target_ratio": 0.25, "ms": 4.0}], 2)
    out = tmp_path / "merged.json"
    merge_results(out, [old, new])
    merged = json.loads(out.read_text())
    ms = {(r["n_branches"], r["mode"], r["target_ratio"]): r["ms"] for r in merged["rows"]}
    assert ms == {(17, "specfold", 0.5): 6.9, (5, "specfold", 0.5): 3.0, (17, "dense", None): 7.0,
                  (17, "specfold", 0.25): 4.0}
    assert [h["seconds"] for h in merged["runs"]] == [1, 2]
    merge_results(out, [out, new])  # merging into itself keeps the run headers, adds the new one
    assert len(json.loads(out.read_text())["rows"]) == 4
    assert [h["seconds"] for h in json.loads(out.read_text())["runs"]] == [1, 2, 2]


def test_cli_merge_keeps_what_out_already_holds(tmp_path):
    def run(path, rows):
        path.write_text(json.dumps({"versions": {}, "suite": "per_check", "seconds": 1, "rows": rows}))
        return str(path)

    row = {"model": "m", "prefix": 512, "mode": "dense", "target_ratio": None, "cuda_graph": True}
    out = tmp_path / "per_check.json"
    run(out, [{**row, "n_branches": 1, "ms": 4.0}, {**row, "n_branches": 5, "ms": 5.0}])
    new = run(tmp_path / "new.json", [{**row, "n_branches": 5, "ms": 4.5}, {**row, "n_branches": 9, "ms": 6.0}])
    assert main([str(out), new]).is_file()
    ms = {r["n_branches"]: r["ms"] for r in json.loads(out.read_text())["rows"]}
    assert ms == {1: 4.0, 5: 4.5, 9: 6.0}


def _write(path, suite, rows):
    path.write_text(json.dumps({"versions": {}, "suite": suite, "seconds": 1, "rows": rows}))
    return path


def _assert_png(out, json_path):
    assert out == json_path.with_suffix(".png") and out.is_file()
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 1000


def test_breakdown_plot_writes_png(tmp_path):
    rng = random.Random(0)
    parts = ("dense_gemm", "attention_prefix", "gate", "rest(elementwise,norms)")
    rows = [{"model": model, "mode": mode, "n_branches": n, "prefix": 512, "recompute_ratio": rng.uniform(0.1, 1),
             "part": part, "ms_per_forward": rng.uniform(0.05, 3), "ms_per_layer": rng.uniform(0.001, 0.1),
             "share": rng.random(), "kernels_per_forward": rng.randint(1, 200)}
            for model in ("m1", "m2") for n in (1, 17) for mode in ("dense_compiled", "specfold") for part in parts
            if not (mode == "dense_compiled" and part == "gate")]  # a part one mode has and another has not
    path = _write(tmp_path / "breakdown.json", "breakdown", rows)
    _assert_png(plot_breakdown(path), path)


def test_memory_plot_writes_png(tmp_path):
    rng = random.Random(1)
    rows = [{"model": "m", "prefix": prefix, "n_branches": n, "mode": mode, "peak_bytes": rng.randint(10**9, 10**10),
             "extra_bytes": n * rng.randint(10**6, 10**7), "weight_bytes": 10**9, "cache_bytes": prefix * 10**4,
             "per_branch_cache_copy_bytes": n * prefix * 10**4}
            for prefix in (2048, 8192) for n in (1, 9, 33) for mode in ("dense", "specfold")]
    path = _write(tmp_path / "memory.json", "memory", rows)
    _assert_png(plot_memory(path), path)


def _end_to_end_rows(rng):
    measured = [{"task": task, "mode": mode, "tokens_per_s": rng.uniform(100, 3000), "accuracy": 1.0,
                 "kind": "measured (trained 3.8M model, test GPU)"}
                for task in ("math", "code") for mode in ("vanilla", "spiffy", "specfold", "specfold_fold_all")]
    projected = [{"task": task, "mode": mode, "shape": shape, "kind": kind, "latency": latency,
                  "projected_tokens_per_s": rng.uniform(50, 1500), "projected_ms": rng.uniform(100, 2000)}
                 for kind, latency in (("projected", "ms"), ("projected, launched", "launched_ms"))
                 for shape in ("fast-dllm-v2-1.5b", "fast-dllm-v2-7b") for task in ("math", "code")
                 for mode in ("vanilla", "spiffy", "specfold")]
    return measured + projected


def test_end_to_end_plot_writes_png(tmp_path):
    path = _write(tmp_path / "end_to_end.json", "end_to_end", _end_to_end_rows(random.Random(2)))
    _assert_png(plot_end_to_end(path), path)


def test_end_to_end_projected_panels_say_projected():
    """One panel per kind of number: the measured run, then each (shape, latency) projection, every
    projected one titled so."""
    panels = end_to_end_panels(_end_to_end_rows(random.Random(3)))
    titles = [title for title, _ in panels]
    assert titles[0].startswith("measured") and len(panels[0][1]) == 8
    assert len(titles) == 5 and all("projected" in t for t in titles[1:])
    assert len({t for t in titles if "launched" in t}) == 2 and all(len(bars) == 6 for _, bars in panels[1:])


def test_plot_results_dispatches_on_suite(tmp_path):
    path = _write(tmp_path / "e2e.json", "end_to_end", _end_to_end_rows(random.Random(4)))
    _assert_png(plot_results(path), path)


def test_plot_results_unknown_suite_is_an_error(tmp_path):
    path = _write(tmp_path / "launch.json", "launch", [{"mode": "host_probe", "eager_add_us": 1.5}])
    with pytest.raises(ValueError, match="'launch'.*per_check.*breakdown.*memory.*end_to_end"):
        plot_results(path)


def test_merge_keeps_every_part_of_breakdown_runs(tmp_path):
    """Breakdown rows of one (model, mode, N) differ only by part: merging two runs (one model each, as a
    run cut by its time limit and its rerun) keeps every part, and a rerun's part replaces the old one."""
    def run(path, model, ms):
        rows = [{"model": model, "mode": "specfold", "n_branches": 17, "prefix": 512, "part": part,
                 "ms_per_forward": ms * (i + 1)} for i, part in enumerate(("dense_gemm", "attention_prefix"))]
        path.write_text(json.dumps({"versions": {}, "suite": "breakdown", "seconds": 1, "rows": rows}))
        return path

    out = merge_results(tmp_path / "merged.json", [run(tmp_path / "a.json", "m1", 0.3),
                                                   run(tmp_path / "b.json", "m2", 0.7),
                                                   run(tmp_path / "c.json", "m1", 0.4)])
    ms = {(r["model"], r["part"]): r["ms_per_forward"] for r in json.loads(out.read_text())["rows"]}
    assert ms == {("m1", "dense_gemm"): 0.4, ("m1", "attention_prefix"): 0.8,
                  ("m2", "dense_gemm"): 0.7, ("m2", "attention_prefix"): 1.4}


def _budget_rows(rng):
    """Trace-driven rows of two modes at three draft budgets (16 without the field, as rows of the default)."""
    return [{"model": "fast-dllm-v2-1.5b", "task": task, "mode": mode, "tokens_per_s": rng.uniform(100, 3000),
             "nfe": 5.0, "trace_driven": True, **({} if budget == 16 else {"draft_budget": budget})}
            for budget in (16, 8, 4) for task in ("math", "code") for mode in ("spiffy_compiled", "specfold")]


def test_rows_at_several_draft_budgets_plot_and_report_by_budget(tmp_path):
    """Rows at several draft budgets merge as separate points, plot tokens/s against the budget (a panel per
    model and task), and the report pairs the modes at each budget and each mode's fastest budget."""
    from bench.report_e2e import render_draft_budget

    rows = _budget_rows(random.Random(5))
    runs = [_write(tmp_path / f"b{b}.json", "end_to_end", [r for r in rows if r.get("draft_budget", 16) == b])
            for b in (16, 8, 4)]
    merged = merge_results(tmp_path / "budgets.json", runs)
    assert len(json.loads(merged.read_text())["rows"]) == len(rows) == 12
    _assert_png(plot_end_to_end(merged), merged)
    table = render_draft_budget({"rows": rows})
    per_budget = [line for line in table if line.startswith("| 1.5B") and line.count("|") == 8]
    assert [line.split(" | ")[1:3] for line in per_budget] == [[t, b] for t in ("math", "code")
                                                               for b in ("4", "8", "16")]
    best = [line.split(" | ") for line in table if line.startswith("| 1.5B") and line.count("|") == 6]
    for (task, sp_cell, sf_cell, ratio) in (cells[1:5] for cells in best):
        pick = {m: max((r for r in rows if (r["task"], r["mode"]) == (task, m)), key=lambda r: r["tokens_per_s"])
                for m in ("spiffy_compiled", "specfold")}
        sp, sf = pick["spiffy_compiled"], pick["specfold"]
        assert sp_cell == f"{sp['tokens_per_s']:.0f} ({sp.get('draft_budget', 16)})"
        assert sf_cell == f"{sf['tokens_per_s']:.0f} ({sf.get('draft_budget', 16)})"
        assert ratio == f"{pick['specfold']['tokens_per_s'] / pick['spiffy_compiled']['tokens_per_s']:.2f}x |"
    assert len(best) == 2


def test_packed_attention_rows_are_their_own_series():
    """A replayed SpecFold row with ``packed_attention`` (``bench.batched --packed-attention on``) is a series
    and a point of its own, named in the headline's column; one without the key (older runs) is not."""
    from bench.plot import _point, serving_series
    from bench.report_batched import render_batched_headline

    row = {"model": "m", "concurrency": 4, "mode": "specfold_compiled", "attention": "ragged", "cuda_graphs": True,
           "tokens_per_s": 100.0, "p50_latency_ms": 1.0, "p99_latency_ms": 2.0, "trace_driven": True}
    packed = {**row, "packed_attention": True}
    assert serving_series(packed) == serving_series(row) + "+packed attention"
    assert serving_series({**row, "packed_attention": False}) == serving_series(row)
    assert _point(packed) != _point(row) and _point({**row, "packed_attention": False}) == _point(row)
    assert "attention over the packed rows (tokens/s)" in render_batched_headline({"rows": [packed]})[0]
