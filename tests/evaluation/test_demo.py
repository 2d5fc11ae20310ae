"""``specfold demo`` on a CPU: every block labelled, what it shows stated, the GPU speed-up quoted from
the committed results (their hardware and versions read from the JSON), no crash; and the headline
numbers computed from the JSON rows."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specfold_compile.cli import main
from specfold_compile.cli.demo import gpu_lines
from specfold_compile.eval.headline import HEADLINE_BRANCHES, RESULTS_DIR, gpu_headline


def test_demo_on_cpu_says_what_it_shows(capsys):
    assert main(["demo", "--max-new-tokens", "24"]) == 0
    out = capsys.readouterr().out
    for label in ("[measured here, on CPU", "[what this run shows]", "[the speed-up]", "[the texts]",
                  "--- math: prompt ---", "--- math: vanilla output", "--- code: prompt ---",
                  "--- instruct: prompt ---"):
        assert label in out, label
    assert "lossless: Spiffy's tokens identical to vanilla's: True (3/3 prompts)" in out
    assert "fewer forwards: vanilla " in out and "recompute ratio: SpecFold recomputed " in out
    assert "the speed-up needs a GPU" in out
    versions = json.loads((RESULTS_DIR / "per_check.json").read_text())["versions"]
    assert f"[committed GPU results: {versions['gpu']}, torch {versions['torch']}" in out
    assert f"N = {HEADLINE_BRANCHES} branches" in out


def test_demo_without_committed_results_says_so(tmp_path):
    lines = gpu_lines("cpu", tmp_path, "a model")
    assert any("the speed-up needs a GPU" in line for line in lines)
    assert any(line.startswith("[committed GPU results] no committed GPU results readable in") for line in lines)
    (tmp_path / "per_check.json").write_text("{not json")
    assert gpu_headline(tmp_path).missing  # unreadable: a sentence, not a crash


def _per_check_rows():
    rows = []
    for model, dense, inductor, folded in (("m1", 10.0, 5.0, {0.2: 4.0, 0.6: 8.0}),
                                           ("m2", 20.0, 16.0, {0.2: 10.0, 0.6: 18.0})):
        base = {"model": model, "prefix": 512, "n_branches": HEADLINE_BRANCHES, "cuda_graph": True}
        rows += [{**base, "mode": "dense", "recompute_ratio": 1.0, "ms": dense},
                 {**base, "mode": "dense_compiled", "recompute_ratio": 1.0, "ms": inductor}]
        rows += [{**base, "mode": "specfold", "recompute_ratio": r, "ms": ms} for r, ms in folded.items()]
        rows.append({**base, "mode": "dense", "recompute_ratio": 1.0, "ms": 1.0, "cuda_graph": False})  # launched
        rows.append({**base, "mode": "dense", "recompute_ratio": 1.0, "ms": 1.0, "n_branches": 5})
    return rows


def _end_to_end_rows():
    rows = [{"task": "math", "mode": "specfold_device", "recompute_ratio": 0.5, "tokens_per_s": 1.0,
             "trace_driven": True}]  # a trace-driven row is no measured decode: left out
    for task, host, inductor, device in (("t1", 100.0, 150.0, 180.0), ("t2", 50.0, 40.0, 100.0)):
        for mode, speed in (("specfold", host), ("spiffy_compiled_device", inductor), ("specfold_device", device)):
            rows.append({"model": "tiny", "task": task, "mode": mode, "trace_driven": False, "tokens_per_s": speed})
    return rows


@pytest.fixture
def results(tmp_path) -> Path:
    versions = {"gpu": "Some GPU", "torch": "9.9", "triton": "8.8", "driver": "7.7"}
    (tmp_path / "per_check.json").write_text(json.dumps({"versions": versions, "rows": _per_check_rows()}))
    (tmp_path / "end_to_end.json").write_text(json.dumps({"versions": versions, "rows": _end_to_end_rows()}))
    return tmp_path


def test_headline_numbers_come_from_the_rows(results):
    h = gpu_headline(results, recompute_ratio=0.25)
    assert h.hardware == "Some GPU, torch 9.9, triton 8.8, driver 7.7" and not h.missing
    per_call, decoding = h.lines
    # ratio 0.2 is nearest 0.25: 4/10 and 10/20 of dense eager, 4/5 and 10/16 of Inductor
    assert "recompute ratio 0.20" in per_call and "0.40-0.50x the time of the dense eager forward" in per_call
    assert "0.62-0.80x dense under Inductor" in per_call and "(m1, m2; prefix 512)" in per_call
    # 180/150 and 100/40 of Spiffy under Inductor in the device loop, 180/100 and 100/50 of the Python loop
    assert "decoding tiny (measured, CUDA graphs): SpecFold in the device loop at 1.20-2.50x" in decoding
    assert "the device loop at 1.80-2.00x the Python loop's (tasks t1, t2)" in decoding
    # without a ratio: the recompute ratio of SpecFold's defaults on the shipped model's tasks picks 0.2
    assert "recompute ratio 0.20" in gpu_headline(results).lines[0]


def test_headline_of_the_committed_results_names_their_gpu():
    h = gpu_headline()
    versions = json.loads((RESULTS_DIR / "per_check.json").read_text())["versions"]
    assert not h.missing and h.hardware.startswith(versions["gpu"]) and len(h.lines) == 2


def test_on_cuda_the_table_is_the_measure(results):
    """On a GPU the demo's own table is the measurement; the committed results still follow it."""
    lines = gpu_lines("cuda", results, "a model", "cuda")
    assert lines[1] == "measured above, on this GPU, with a model, calls replayed from CUDA graphs"
    assert not any("needs a GPU" in line for line in lines)
    assert "[committed GPU results: Some GPU, torch 9.9, triton 8.8, driver 7.7]" in lines
    assert "launched calls" in gpu_lines("cuda", results, "a model", None)[1]
