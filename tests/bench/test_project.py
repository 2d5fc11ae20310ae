import json

import pytest

from bench.project import call_ms, main, project, table_from_per_check, with_specfold_from


def _per_check_rows():
    rows = [{"model": "m", "prefix": 512, "n_branches": n, "mode": "dense", "recompute_ratio": 1.0, "ms": ms}
            for n, ms in ((1, 2.0), (5, 4.0), (17, 10.0))]
    rows += [{"model": "m", "prefix": 512, "n_branches": n, "mode": "specfold", "recompute_ratio": r, "ms": ms}
             for n, r, ms in ((5, 0.1, 3.0), (5, 0.5, 5.0), (17, 0.1, 5.0), (17, 0.5, 9.0))]
    rows.append({"model": "m", "prefix": 2048, "n_branches": 5, "mode": "dense", "ms": 99.0})
    return rows


def test_call_ms_interpolates_in_ratio_and_branches():
    table = table_from_per_check(_per_check_rows(), "m", 512)
    assert call_ms(table, 5, 0.3, folded=False) == 4.0
    assert call_ms(table, 11, 1.0, folded=False) == pytest.approx(7.0)      # dense, between N=5 and 17
    assert call_ms(table, 5, 0.3, folded=True) == pytest.approx(4.0)        # between ratios 0.1 and 0.5
    assert call_ms(table, 17, 0.05, folded=True) == 5.0                     # clamped below the lowest ratio
    assert call_ms(table, 3, 0.1, folded=True) == pytest.approx(2.5)        # between dense(1) and N=5
    assert call_ms(table, 1, 0.2, folded=True) == 2.0                       # one branch: the dense forward
    assert call_ms(table, 33, 0.1, folded=True) == 5.0                      # clamped beyond the largest N


def test_project_sums_calls_and_other_forwards(tmp_path):
    run = {"task": "t", "mode": "specfold", "accuracy": 1.0, "nfe": 4.0, "tokens": 30, "forwards": 4,
           "calls": [(1, 1.0), (5, 0.1), (5, 0.5)], "kind": "measured"}
    table = table_from_per_check(_per_check_rows(), "m", 512)
    (row,) = project([run], table, "m")
    assert row["kind"] == "projected" and row["projected_ms"] == pytest.approx(2.0 + 3.0 + 5.0 + 1 * 2.0)
    assert row["projected_tokens_per_s"] == pytest.approx(30 / 0.012)
    e2e, per_check = tmp_path / "e2e.json", tmp_path / "pc.json"
    e2e.write_text(json.dumps({"rows": [run]}))
    per_check.write_text(json.dumps({"rows": [{**r, "model": "fast-dllm-v2-1.5b"} for r in _per_check_rows()]}))
    assert main([str(e2e), str(per_check)]) == 0
    rows = json.loads(e2e.read_text())["rows"]
    assert [r["kind"] for r in rows] == ["measured", "projected"] and rows[1]["projected_ms"] == pytest.approx(12.0)


def test_specfold_at_one_branch_and_the_compiled_spiffy_baseline():
    """N = 1 calls of a SpecFold run cost what backend="specfold" measured at N = 1 (when measured);
    spiffy_compiled charges dense_compiled latencies, and only where they span the run's Ns."""
    rows = _per_check_rows() + [
        {"model": "m", "prefix": 512, "n_branches": 1, "mode": "specfold", "recompute_ratio": 1.0, "ms": 1.5},
        {"model": "m", "prefix": 512, "n_branches": 1, "mode": "dense_compiled", "ms": 1.2},
        {"model": "m", "prefix": 512, "n_branches": 5, "mode": "dense_compiled", "ms": 2.4},
    ]
    table = table_from_per_check(rows, "m", 512)
    assert table["specfold_n1"] == 1.5 and table["specfold"].keys() == {5, 17}
    assert call_ms(table, 1, 1.0, folded=True) == 1.5
    assert call_ms(table, 1, 1.0, folded=False) == 2.0                       # Spiffy's N = 1: dense eager
    assert call_ms(table, 3, 0.1, folded=True) == pytest.approx(2.25)        # between SpecFold(1) and N=5
    assert call_ms(table, 3, 1.0, folded=False, compiled=True) == pytest.approx(1.8)
    spiffy = {"task": "t", "mode": "spiffy", "accuracy": 1.0, "nfe": 3.0, "tokens": 20, "forwards": 3,
              "calls": [(1, 1.0), (5, 1.0)], "kind": "measured"}
    out = project([spiffy], table, "m")
    assert [r["mode"] for r in out] == ["spiffy", "spiffy_compiled"]
    assert out[0]["projected_ms"] == pytest.approx(2.0 + 4.0 + 2.0)
    assert out[1]["projected_ms"] == pytest.approx(1.2 + 2.4 + 2.0)          # prefill stays eager
    wider = {**spiffy, "calls": [(1, 1.0), (17, 1.0)]}                       # N = 17 not compiled-measured
    assert [r["mode"] for r in project([wider], table, "m")] == ["spiffy"]


def test_specfold_calls_cost_what_the_cost_model_runs():
    """At a preset's shape, SpecFold calls the backend would not fold (few branches) cost dense under
    Inductor; calls it folds interpolate only between folded rows; rows measured plain are not folded
    latencies; the fold_all run's calls (with ratios) stand for SpecFold."""
    from bench.project import backend_folds

    shape = "fast-dllm-v2-1.5b"
    rows = [{**r, "model": shape} for r in _per_check_rows()] + [
        {"model": shape, "prefix": 512, "n_branches": n, "mode": "dense_compiled", "ms": ms}
        for n, ms in ((1, 1.2), (5, 2.4), (17, 4.0))] + [
        {"model": shape, "prefix": 512, "n_branches": 9, "mode": "specfold", "recompute_ratio": 0.1, "ms": 7.7,
         "folded": False}]
    table = table_from_per_check(rows, shape, 512)
    assert table["specfold"].keys() == {5, 17}                                # the plain N = 9 row is left out
    assert not backend_folds(shape, 5) and backend_folds(shape, 17)
    assert call_ms(table, 5, 0.1, folded=True, shape=shape) == 2.4           # not folded: dense under Inductor
    assert call_ms(table, 17, 0.1, folded=True, shape=shape) == 5.0          # folded row
    assert call_ms(table, 5, 0.1, folded=True) == 3.0                        # no shape: every call folds
    run = {"task": "t", "accuracy": 1.0, "nfe": 3.0, "tokens": 20, "forwards": 3, "kind": "measured"}
    plain_run = {**run, "mode": "specfold", "calls": [(1, 1.0), (17, 1.0)]}
    fold_all = {**run, "mode": "specfold_fold_all", "calls": [(1, 1.0), (17, 0.1)]}
    (row,) = project([plain_run, fold_all], table, shape)
    assert row["mode"] == "specfold" and row["projected_ms"] == pytest.approx(2.0 + 5.0 + 2.0)


def test_writes_cost_the_measured_write_rows():
    """Prefill / block writes cost the ``write`` row, or ``write_compiled`` for runs that compiled them
    (and for the Inductor Spiffy baseline); a measured spiffy_compiled run replaces the extra row."""
    from bench.project import write_ms

    rows = _per_check_rows() + [
        {"model": "m", "prefix": 512, "n_branches": 1, "mode": "dense_compiled", "ms": 1.2},
        {"model": "m", "prefix": 512, "n_branches": 5, "mode": "dense_compiled", "ms": 2.4},
        {"model": "m", "prefix": 512, "n_branches": 1, "mode": "write", "ms": 1.9},
        {"model": "m", "prefix": 512, "n_branches": 1, "mode": "write_compiled", "ms": 0.7},
        {"model": "m", "prefix": 2048, "n_branches": 1, "mode": "write_compiled", "ms": 99.0},
    ]
    table = table_from_per_check(rows, "m", 512)
    assert (table["write"], table["write_compiled"]) == (1.9, 0.7)
    assert write_ms(table, False) == 1.9 and write_ms(table, True) == 0.7
    no_writes = table_from_per_check(_per_check_rows(), "m", 512)
    assert write_ms(no_writes, True) == write_ms(no_writes, False) == 2.0   # dense eager N = 1
    run = {"task": "t", "accuracy": 1.0, "nfe": 4.0, "tokens": 20, "forwards": 4, "kind": "measured",
           "calls": [(1, 1.0), (5, 1.0)]}
    out = project([{**run, "mode": "spiffy"}], table, "m")
    assert [(r["mode"], r["projected_ms"]) for r in out] == [
        ("spiffy", pytest.approx(2.0 + 4.0 + 2 * 1.9)), ("spiffy_compiled", pytest.approx(1.2 + 2.4 + 2 * 0.7))]
    out = project([{**run, "mode": "specfold", "calls": [(1, 1.0), (5, 0.1)], "compile_writes": True},
                   {**run, "mode": "spiffy"}, {**run, "mode": "spiffy_compiled", "compile_writes": True}], table, "m")
    assert [(r["mode"], r["projected_ms"]) for r in out] == [
        ("specfold", pytest.approx(2.0 + 3.0 + 2 * 0.7)), ("spiffy", pytest.approx(2.0 + 4.0 + 2 * 1.9)),
        ("spiffy_compiled", pytest.approx(1.2 + 2.4 + 2 * 0.7))]


def test_specfold_from_replaces_every_ratio_of_a_measured_point(tmp_path):
    """An ablation run's SpecFold rows replace all SpecFold rows of the same (model, prefix, N), the
    ratios it did not measure included; other points and other modes stay."""
    run = [{"model": "m", "prefix": 512, "n_branches": 17, "mode": "specfold", "recompute_ratio": 0.1, "ms": 4.0},
           {"model": "m", "prefix": 512, "n_branches": 17, "mode": "dense", "recompute_ratio": 1.0, "ms": 77.0}]
    rows = with_specfold_from(_per_check_rows(), run)
    table = table_from_per_check(rows, "m", 512)
    assert table["specfold"][17] == [(0.1, 4.0)]                             # the 0.5 row of N = 17 is gone
    assert table["specfold"][5] == [(0.1, 3.0), (0.5, 5.0)] and table["dense"][17] == 10.0
    e2e, per_check, ablation = tmp_path / "e2e.json", tmp_path / "pc.json", tmp_path / "run.json"
    call = {"task": "t", "mode": "specfold", "accuracy": 1.0, "nfe": 2.0, "tokens": 30, "forwards": 2,
            "calls": [(1, 1.0), (17, 0.5)], "kind": "measured"}
    e2e.write_text(json.dumps({"rows": [call]}))
    per_check.write_text(json.dumps({"rows": [{**r, "model": "fast-dllm-v2-7b"} for r in _per_check_rows()]}))
    ablation.write_text(json.dumps({"rows": [{**r, "model": "fast-dllm-v2-7b"} for r in run]}))
    assert main([str(e2e), str(per_check), "--specfold-from", str(ablation)]) == 0
    out = json.loads(e2e.read_text())
    assert out["projected_from"]["specfold_from"] == [str(ablation)]
    assert out["rows"][1]["projected_ms"] == pytest.approx(2.0 + 4.0)      # N = 17 at r = 0.5: clamped to 4.0


def test_launched_latencies_project_apart_and_are_labelled(tmp_path):
    """A table read from ``launched_ms`` charges those latencies (rows without the field are left out),
    and its rows say so; main projects both fields when the per_check rows have launched ones."""
    rows = [{**r, "launched_ms": 2 * r["ms"]} for r in _per_check_rows() if r["mode"] != "specfold" or r["n_branches"] != 5]
    rows += [r for r in _per_check_rows() if r["mode"] == "specfold" and r["n_branches"] == 5]  # no launched_ms
    table = table_from_per_check(rows, "m", 512, latency="launched_ms")
    assert table["dense"] == {1: 4.0, 5: 8.0, 17: 20.0} and table["specfold"].keys() == {17}
    run = {"task": "t", "mode": "spiffy", "accuracy": 1.0, "nfe": 2.0, "tokens": 10, "forwards": 2,
           "calls": [(5, 1.0)], "kind": "measured"}
    (row,) = project([run], table, "m", latency="launched_ms")
    assert row["kind"] == "projected, launched" and row["latency"] == "launched_ms"
    assert row["projected_ms"] == pytest.approx(8.0 + 4.0)
    with pytest.raises(ValueError, match="latency"):
        table_from_per_check(rows, "m", 512, latency="wall")
    e2e, per_check = tmp_path / "e2e.json", tmp_path / "pc.json"
    e2e.write_text(json.dumps({"rows": [run]}))
    per_check.write_text(json.dumps({"rows": [{**r, "model": "fast-dllm-v2-1.5b"} for r in rows]}))
    assert main([str(e2e), str(per_check)]) == 0
    out = json.loads(e2e.read_text())["rows"]
    assert [(r["kind"], r.get("projected_ms")) for r in out] == [
        ("measured", None), ("projected", pytest.approx(4.0 + 2.0)), ("projected, launched", pytest.approx(12.0))]
    assert main([str(e2e), str(per_check), "--latency", "ms"]) == 0  # re-projecting replaces both
    assert [r["kind"] for r in json.loads(e2e.read_text())["rows"]] == ["measured", "projected"]
