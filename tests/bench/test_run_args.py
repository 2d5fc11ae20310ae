"""bench.run's command line and its suites on the dry-run shapes (CPU): filters that match nothing are errors,
every part writes the rows the README's tables are made of."""
import json

import pytest

from bench import run


def test_unknown_ratio_is_an_error_naming_the_targets(capsys):
    with pytest.raises(SystemExit) as exc:
        run.main(["--suite", "per_check", "--cpu-dry-run", "--ratios", "0.1875"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--ratios" in err and "0.1875" in err and str(sorted(run.CHANGED_FOR_RATIO)) in err



def test_check_suite_counts_every_fold_op_with_its_impl(tmp_path, monkeypatch):
    """The check suite's op counts read each fold op's impl from its schema: every op of a folded
    layer is counted under "name[impl]" (CPU dry run: torch impls)."""
    monkeypatch.setenv("OUT", str(tmp_path))
    run.main(["--suite", "check", "--cpu-dry-run"])
    for row in json.loads((tmp_path / "check.json").read_text())["rows"]:
        for name in ("fold_gate", "packed_linear", "folded_attention", "packed_silu_mul"):
            assert row["graph_ops"].get(f"specfold::{name}[torch]", 0) > 0, row["graph_ops"]


def test_logit_fraction_per_check(tmp_path, monkeypatch, capsys):
    """--logit-fraction: every mode's rows carry it, and the floor counts the LM head on that many rows
    (lower where the FLOPs bound it, the same where the weight read does)."""
    monkeypatch.setenv("OUT", str(tmp_path))
    args = ["--suite", "per_check", "--cpu-dry-run", "--models", "fast-dllm-v2-1.5b", "--prefixes", "512", "--ns", "3",
            "--ratios", "0.25",
            "--no-inductor"]
    run.main(args + ["--logit-fraction", "0.5"])
    half = json.loads((tmp_path / "per_check.json").read_text())["rows"]
    run.main(args)
    full = json.loads((tmp_path / "per_check.json").read_text())["rows"]
    assert {r["mode"] for r in half} >= {"dense", "specfold", "floor"}
    assert all(r.get("logit_fraction") == 0.5 for r in half) and not any("logit_fraction" in r for r in full)
    timed = [r for r in half if r["mode"] in ("dense", "specfold")]  # CUDA-graph and launched timings
    assert timed and all(r["ms"] > 0 and r["launched_ms"] > 0 for r in timed)
    assert not any("launched_ms" in r for r in half if r["mode"] == "floor")
    floors = [(a["ms"], b["ms"]) for a, b in zip(half, full) if a["mode"] == "floor"]
    assert floors and all(a <= b for a, b in floors) and any(a < b for a, b in floors)
    for bad in (["0"], ["1.5"], ["half"], ["0.5", "--fold-head"]):
        with pytest.raises(SystemExit):
            run.main(args + ["--logit-fraction", *bad])
        assert "--logit-fraction" in capsys.readouterr().err


def test_launch_suite_times_and_profiles_each_mode(tmp_path, monkeypatch):
    """--suite launch: CUDA-graph (here plain) and launched latency, host time and a cProfile file for
    dense under Inductor and SpecFold (which folds at N = 3 with fold_min_branches 2)."""
    monkeypatch.setenv("OUT", str(tmp_path))
    run.main(["--suite", "launch", "--cpu-dry-run", "--models", "fast-dllm-v2-1.5b", "--ns", "3",
              "--fold-min-branches", "2", "--logit-fraction", "0.5"])
    rows = json.loads((tmp_path / "launch.json").read_text())["rows"]
    probe, rows = rows[0], rows[1:]
    assert probe["mode"] == "host_probe" and probe["eager_add_us"] > 0
    assert [r["mode"] for r in rows] == ["dense_compiled", "specfold"] and rows[1]["folded"]
    assert all(r["ms"] > 0 and r["launched_ms"] > 0 and r["host_ms"] > 0 and r["logit_fraction"] == 0.5 for r in rows)
    assert rows[1]["launched_folded_ms"] > 0 and "launched_folded_ms" not in rows[0]
    text = (tmp_path / "launch_profile_fast-dllm-v2-1.5b_specfold_n3.txt").read_text()
    assert "cumulative" in text and "packed_linear" in text


def test_decode_loop_windows_part(tmp_path, monkeypatch):
    """--decode-parts windows: replayed calls and block writes through attention windows against the
    whole capacity, each windowed result compared with the whole-capacity one."""
    monkeypatch.setenv("OUT", str(tmp_path))
    run.main(["--suite", "decode_loop", "--cpu-dry-run", "--decode-parts", "windows", "--models", "fast-dllm-v2-1.5b"])
    check, *rows = json.loads((tmp_path / "decode_loop.json").read_text())["rows"]
    assert check["part"] == "window_check" and check["rel_err_window_vs_whole"] < 1e-5
    assert check["argmax_agree_window_vs_whole"] == check["argmax_agree_dynamic_vs_whole"] == 1.0
    assert {(r["mode"], r["windows"]) for r in rows} == {(m, w) for m in ("spiffy_compiled", "specfold", "eager_writes")
                                                         for w in (None, 256)}
    for r in rows:
        assert r["cuda_graph_ms"] > 0 and r["capacity"] == 4096
        assert r["window"] == (4097 if r["windows"] is None else 512 if r["n_branches"] else 1024)
        if r["windows"] is not None and r["n_branches"]:
            assert r["tokens_agree_vs_whole"] == 1.0 and r["max_conf_diff_vs_whole"] < 1e-4
        elif r["windows"] is not None:
            assert r["rel_err_vs_whole"] < 1e-5


def test_decode_loop_shape_and_writes_parts(tmp_path, monkeypatch):
    """--decode-parts shape,writes (the README's decode-step and block-write rows) on the dry-run shapes:
    every mode and N timed launched and replayed; the static cache's logits and writes against the
    dynamic cache's (eager: equal; compiled: the same difference as the dynamic compiled write)."""
    monkeypatch.setenv("OUT", str(tmp_path))
    run.main(["--suite", "decode_loop", "--cpu-dry-run", "--decode-parts", "shape,writes", "--models",
              "fast-dllm-v2-1.5b"])
    rows = json.loads((tmp_path / "decode_loop.json").read_text())["rows"]
    check = [r for r in rows if r["part"] == "shape_check"]
    # bf16 on the CPU: attention over the static capacity (masked keys included) and over the dynamic
    # prefix may accumulate in another order, depending on the CPU's matmul kernels (the H200 gives 0).
    assert len(check) == 1 and check[0]["rel_err_static_vs_dynamic"] < 1e-3 and check[0]["argmax_agree"] == 1.0
    shape = [r for r in rows if r["part"] == "shape"]
    assert {(r["mode"], r["n_branches"]) for r in shape} == {(m, n) for m in ("spiffy_compiled", "specfold")
                                                             for n in (1, 9, 17)}
    assert all(r["launched_ms"] > 0 and r["cuda_graph_ms"] > 0 for r in shape)
    assert all(r["tokens_agree_vs_launched"] == 1.0 for r in shape if r["mode"] == "spiffy_compiled")
    writes = {(r["write"], r["compiled"]): r for r in rows if r["part"] == "write"}
    assert len(writes) == 6 and all(r["ms"] > 0 for r in writes.values())
    for kind in ("static_launched", "static_cuda_graph"):
        assert writes[kind, False]["rel_err_next_logits_vs_dynamic_eager"] == 0.0
        assert writes[kind, True]["rel_err_next_logits_vs_dynamic_eager"] == pytest.approx(
            writes["dynamic_launched", True]["rel_err_next_logits_vs_dynamic_eager"], rel=0.05)
