"""bench.trace_driven: a record of the shipped model's decode, replayed on random models of both families
at the record's block size, makes the recorded calls (every mode) and writes the end-to-end rows."""
import gc
import json

import pytest
import torch

from bench import plot, report_e2e, trace_driven

KEYS = {"model", "task", "mode", "tokens_per_s", "nfe", "step_ms", "host_ms", "ttft_ms", "trace_driven", "cuda_graphs"}
TINY_AT_RECORD_SHAPE = "block_size=32,sub_block_size=8,vocab_size=1040"


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "trace.pt"
    assert trace_driven.main(["record", "--device", "cpu", "--limit", "1", "--tasks", "instruct",
                              "--max-new-tokens", "40", "--grid", "--out", str(path)]) == 0
    return path


def test_replay_reproduces_the_record(trace, tmp_path):
    out = tmp_path / "rows.json"
    assert trace_driven.main(["replay", "--device", "cpu", "--eager-graphs", "--trace", str(trace),
                              "--models", "tiny-fast-dllm-v2,tiny-nld", "--modes", "vanilla,specfold",
                              "--override", TINY_AT_RECORD_SHAPE, "--out", str(out)]) == 0
    record = torch.load(trace, weights_only=False)
    (prompt,) = record["prompts"]
    assert prompt["prompt"].numel() % 32 == 0  # --grid: whole blocks
    assert any(s.masks is not None and s.masks.any() for s in prompt["spiffy"]["steps"]), "the record folded nothing"
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["mode"]) for r in rows] == [(m, mode) for m in ("tiny-fast-dllm-v2", "tiny-nld")
                                                       for mode in ("vanilla", "specfold")]
    for r in rows:
        assert KEYS <= set(r) and r["trace_driven"] is True and r["trace_reproduced"] is True
        assert r["nfe"] == prompt["spiffy" if r["mode"] == "specfold" else "vanilla"]["nfe"]
        assert r["tokens_per_s"] > 0 and r["step_ms"] > 0 and r["draft_budget"] == 16


def test_all_logits_replays_the_same_calls(trace, tmp_path):
    """``--all-logits``: every position's logits in each step, the same recorded calls (a row says which);
    ``--tag-repeat K``: the rows carry ``repeat`` = K, untagged rows none."""
    rows = {}
    for flag in ([], ["--all-logits", "--tag-repeat", "2"]):
        out = tmp_path / f"rows{len(flag)}.json"
        assert trace_driven.main(["replay", "--device", "cpu", "--eager-graphs", "--trace", str(trace), *flag,
                                  "--models", "tiny-fast-dllm-v2", "--modes", "spiffy",
                                  "--override", TINY_AT_RECORD_SHAPE, "--out", str(out)]) == 0
        (rows[bool(flag)],) = json.loads(out.read_text())["rows"]
    for every, row in rows.items():
        assert row["all_logits"] is every and row["trace_reproduced"] is True
        assert row.get("repeat") == (2 if every else None)
    assert rows[True]["nfe"] == rows[False]["nfe"]


def test_replay_profile_writes_a_profile_a_mode(trace, tmp_path):
    """``--profile DIR``: one more plain pass a mode under cProfile, the decode loop's functions in it;
    ``--freeze-gc``: the rows say so, and the collector is unfrozen afterwards."""
    assert trace_driven.main(["replay", "--device", "cpu", "--eager-graphs", "--trace", str(trace),
                              "--models", "tiny-fast-dllm-v2", "--modes", "vanilla,spiffy",
                              "--override", TINY_AT_RECORD_SHAPE, "--profile", str(tmp_path / "prof"),
                              "--freeze-gc", "--out", str(tmp_path / "rows.json")]) == 0
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert [r["freeze_gc"] for r in rows] == [True] * len(rows) and gc.get_freeze_count() == 0
    for mode in ("vanilla", "spiffy"):
        text = (tmp_path / "prof" / f"prof_tiny-fast-dllm-v2_{mode}.txt").read_text()
        assert "decode_on_device" in text and "tottime" in text


def test_replay_errors(trace, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        trace_driven.main(["replay", "--device", "cpu", "--trace", str(trace), "--override", "block_size=x"])
    assert exc.value.code == 2 and "--override" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        trace_driven.main(["replay", "--device", "cpu", "--trace", str(trace), "--tag-repeat", "0"])
    assert exc.value.code == 2 and "--tag-repeat: expected a run number >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="block size 16, the record's is 32"):
        trace_driven.main(["replay", "--device", "cpu", "--trace", str(trace), "--models", "tiny-nld",
                           "--out", str(tmp_path / "x.json")])


def test_a_writes_only_record_replays_as_such(tmp_path):
    """``--fuse-boundaries writes`` and a draft budget of 8: the record keeps both, the replay decodes with
    them and its rows and header say so (rows of another budget are another merge point)."""
    path, out = tmp_path / "writes.pt", tmp_path / "writes.json"
    assert trace_driven.main(["record", "--device", "cpu", "--limit", "1", "--tasks", "math", "--max-new-tokens", "40",
                              "--fuse-boundaries", "writes", "--draft-budget", "8", "--out", str(path)]) == 0
    assert torch.load(path, weights_only=False)["fuse_boundaries"] == "writes"
    assert trace_driven.main(["replay", "--device", "cpu", "--eager-graphs", "--trace", str(path), "--models",
                              "tiny-fast-dllm-v2", "--modes", "vanilla,spiffy", "--override", TINY_AT_RECORD_SHAPE,
                              "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    for row in written["rows"]:
        assert row["fuse_boundaries"] == "writes" and row["trace_reproduced"] is True
        assert row["draft_budget"] == 8 and plot.drafts_bound(row) == 8
    assert written["setup"]["draft_budget"] == 8


def test_compile_writes_replays_the_prefill_and_writes_compiled(trace, tmp_path, monkeypatch):
    """``--compile-writes``: the replay's prefill (and block writes) go through ``torch.compile`` (aot_eager
    here, in place of Inductor's C++ compile), the record still reproduced."""
    from specfold_compile.models.cache import PrefixCacheMethods

    compiled = []

    def compiled_method(self, name):
        compiled.append(name)
        return torch.compile(getattr(self, name), backend="aot_eager")

    monkeypatch.setattr(PrefixCacheMethods, "compiled_method", compiled_method)
    out = tmp_path / "compiled.json"
    try:
        assert trace_driven.main(["replay", "--device", "cpu", "--eager-graphs", "--trace", str(trace), "--models",
                                  "tiny-fast-dllm-v2", "--modes", "vanilla", "--override", TINY_AT_RECORD_SHAPE,
                                  "--compile-writes", "--out", str(out)]) == 0
    finally:
        torch._dynamo.reset()
    (row,) = json.loads(out.read_text())["rows"]
    assert row["compile_writes"] is True and row["trace_reproduced"] is True
    assert "prefill_static" in compiled  # the record's one block ends at its eos: no block write


def test_heads_mode_takes_its_profile_from_another_record(trace, tmp_path, capsys):
    """``specfold_heads`` with ``--heads-from``: the other record's per-gate profile
    (``fold_masks.dense_fractions``) in its row and its backend's options, the recorded calls made."""
    from specfold_compile.ops.fold_masks import dense_fractions

    other = tmp_path / "train.pt"
    assert trace_driven.main(["record", "--device", "cpu", "--limit", "1", "--tasks", "math", "--split", "train",
                              "--max-new-tokens", "40", "--grid", "--out", str(other)]) == 0
    recorded = torch.load(other, weights_only=False)
    assert recorded["split"] == "train"
    pairs = [(g, s.masks[g]) for p in recorded["prompts"] for s in p["spiffy"]["steps"] if s.masks is not None
             for g in range(s.masks.shape[0])]
    want = dense_fractions(pairs, quantile=0.5)
    assert len(want) == recorded["layers"]
    out = tmp_path / "rows.json"
    assert trace_driven.main(["replay", "--device", "cpu", "--eager-graphs", "--trace", str(trace),
                              "--models", "tiny-fast-dllm-v2", "--modes", "specfold,specfold_heads",
                              "--heads-from", str(other), "--heads-quantile", "0.5",
                              "--override", TINY_AT_RECORD_SHAPE, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [r["mode"] for r in rows] == ["specfold", "specfold_heads"]
    assert all(r["trace_reproduced"] for r in rows) and rows[0]["nfe"] == rows[1]["nfe"]
    assert "dense_fraction" not in rows[0]
    assert rows[1]["dense_fraction"] == pytest.approx(list(want)) and rows[1]["heads_from"] == str(other)
    single = tmp_path / "single.json"  # one head for every layer instead of the profile
    assert trace_driven.main(["replay", "--device", "cpu", "--eager-graphs", "--trace", str(trace),
                              "--models", "tiny-fast-dllm-v2", "--modes", "specfold_heads", "--dense-fraction", "0.25",
                              "--override", TINY_AT_RECORD_SHAPE, "--out", str(single)]) == 0
    (row,) = json.loads(single.read_text())["rows"]
    assert row["trace_reproduced"] and row["nfe"] == rows[0]["nfe"]
    assert (row["dense_fraction"], row["heads_from"]) == (0.25, None)
    assert report_e2e.mode_name(row) == "SpecFold, head 0.25 of the rows"
    assert report_e2e.mode_name(rows[1]) == "SpecFold, per-layer heads"
    for argv, match in ((["--modes", "specfold_heads"], "--heads-from: expected with the mode specfold_heads"),
                        (["--heads-from", str(other)], "--heads-from: expected with the mode specfold_heads"),
                        (["--dense-fraction", "0.2"], "--heads-from: expected with the mode specfold_heads"),
                        (["--modes", "specfold_heads", "--dense-fraction", "0"],
                         "--dense-fraction: expected a fraction"),
                        (["--modes", "specfold_heads", "--dense-fraction", "0.2", "--heads-from", str(other)],
                         "--dense-fraction: expected instead of --heads-from"),
                        (["--modes", "specfold_heads", "--heads-from", str(tmp_path / "none.pt")], "--heads-from")):
        with pytest.raises(SystemExit):
            trace_driven.main(["replay", "--device", "cpu", "--trace", str(trace), *argv,
                               "--out", str(tmp_path / "x.json")])
        assert match in capsys.readouterr().err


def test_step_ratio_compares_the_same_calls_only():
    """The per-step column: Spiffy under Inductor's step over the row's, from the plain passes where a row
    has them; a row that made other calls (vanilla: a different number of steps) gets none."""
    def row(mode, steps, plain_step_ms, step_ms=9.0):
        return {"model": "m", "task": "math", "mode": mode, "trace_driven": True, "fuse_boundaries": False,
                "steps": steps, "plain_step_ms": plain_step_ms, "step_ms": step_ms}
    base, folded, vanilla = row("spiffy_compiled", 16, 4.0), row("specfold", 16, 3.2), row("vanilla", 25, 3.0)
    data = {"rows": [vanilla, base, folded]}
    assert report_e2e._step_ratio(data, folded) == "1.25x"
    assert report_e2e._step_ratio(data, vanilla) == ""
    instrumented_only = row("specfold", 16, None, step_ms=2.0)  # no plain passes: the instrumented step
    assert report_e2e._step_ratio(data, instrumented_only) == "2.00x"
    assert report_e2e._step_ratio({"rows": [folded]}, folded) == ""  # no Spiffy row to compare with


def test_repeats_of_one_point_are_kept_and_compared_within_their_run(tmp_path):
    """Rows tagged with a ``repeat`` survive a merge side by side, each ratio column compares a row with
    Spiffy under Inductor of its own run, and the table names the run."""
    def row(mode, repeat, tokens_per_s, step_ms):
        return {"model": "fast-dllm-v2-1.5b", "task": "math", "mode": mode, "trace_driven": True,
                "fuse_boundaries": True, "repeat": repeat, "steps": 9, "tokens_per_s": tokens_per_s,
                "step_ms": step_ms, "plain_step_ms": step_ms, "host_ms": 0.1, "nfe": 2.5, "ttft_ms": 10.0,
                "trace_reproduced": True}
    runs = [[row("spiffy_compiled", 1, 2000.0, 3.0), row("specfold", 1, 2400.0, 2.5)],
            [row("spiffy_compiled", 2, 1600.0, 4.0), row("specfold", 2, 2400.0, 2.0)]]
    paths = []
    for i, rows in enumerate(runs):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps({"suite": "end_to_end", "rows": rows}))
    data = json.loads(plot.merge_results(tmp_path / "merged.json", paths).read_text())
    assert len(data["rows"]) == 4
    second = data["rows"][3]
    assert report_e2e._e2e_ratio(data, second) == "1.50x" and report_e2e._step_ratio(data, second) == "2.00x"
    assert report_e2e._e2e_ratio(data, data["rows"][1]) == "1.20x"
    table = "\n".join(report_e2e.render_end_to_end(data))
    assert "| fused, run 2 | SpecFold | 2400 |" in table
