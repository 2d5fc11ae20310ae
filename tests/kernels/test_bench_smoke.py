"""The kernel benchmarks and check_all import and run (--quick tiny shapes) without crashing."""
import importlib
import json

import pytest

pytest.importorskip("triton")


@pytest.mark.parametrize("name, flags", [("bench_gate", ()), ("bench_attention", ()),
                                         ("bench_attention", ("--split-sweep",)), ("bench_attention", ("--one-pass-sweep",)),
                                         ("bench_packed_linear", ()), ("bench_ragged_attention", ()),
                                         ("bench_ragged_attention", ("--splits", "2")), ("bench_folded_ragged_attention", ()),
                                         ("check_all", ())])
def test_bench_quick(name, flags, tmp_path):
    mod = importlib.import_module(f"bench.kernels.{name}")
    out = tmp_path / f"{name}.json"
    ret = mod.main(["--quick", *flags, "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["results"], name
    if name == "check_all":
        assert ret == 0
    else:
        for r in data["results"]:
            if r.get("layer") == "all":  # packed_linear's per-layer summary rows
                assert r["op_ms"] > 0 and r["dense_ms"] > 0, r
                continue
            assert r["max_rel_err"] < 2e-2, r
            assert r.get("op_max_rel_err", 0.0) < 2e-2, r
