import json

from bench.plot import plot_per_check


def test_per_check_plot_writes_png(tmp_path):
    rows = [{"model": "m", "prefix": 512, "n_branches": n, "mode": mode, "ms": ms, "recompute_ratio": 1.0,
             "cuda_graph": True, **({"target_ratio": 0.25} if mode == "specfold" else {})}
            for n in (1, 5) for mode, ms in (("dense", 2.0 * n), ("floor", 1.0))] + \
           [{"model": "m", "prefix": 512, "n_branches": 5, "mode": "specfold", "ms": 3.0, "recompute_ratio": 0.2,
             "cuda_graph": True, "target_ratio": 0.25}]
    path = tmp_path / "per_check.json"
    path.write_text(json.dumps({"rows": rows}))
    out = plot_per_check(path)
    assert out.exists() and out.stat().st_size > 1000
