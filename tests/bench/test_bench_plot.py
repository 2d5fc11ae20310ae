import json

from bench.plot import main, merge_results, plot_per_check


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
