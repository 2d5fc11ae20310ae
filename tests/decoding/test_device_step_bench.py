"""bench/end_to_end.py on the CPU: every mode's row, the device loop's tokens and forwards equal the
Python loop's."""
import json

import pytest

from bench import end_to_end


def test_end_to_end_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    assert end_to_end.main(["--device", "cpu", "--limit", "2", "--tasks", "math", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["versions"]["torch"] and "triton" in data["versions"]
    rows = {r["mode"]: r for r in data["rows"]}
    assert set(rows) == set(end_to_end.CPU_MODES)
    keys = {"model", "task", "mode", "tokens_per_s", "nfe", "step_ms", "host_ms", "ttft_ms", "trace_driven",
            "cuda_graphs"}
    for r in rows.values():
        assert keys <= set(r) and r["task"] == "math" and r["trace_driven"] is False and r["cuda_graphs"] is False
        assert r["tokens_per_s"] > 0 and r["step_ms"] > 0 and r["ttft_ms"] > 0 and r["nfe"] >= 1
        assert r["instrumented_tokens_per_s"] > 0
        assert r["tokens_match"] is True
        assert r["gc_ms"] >= 0 and r["gc_collections"] >= 0
        assert r["plain_step_ms"] > 0 and r["plain_host_ms"] < r["plain_step_ms"]
    for mode in ("vanilla_device", "spiffy_device"):
        assert rows[mode]["same_as_host_twin"] is True
        assert 0 < rows[mode]["outside_steps_ms"] < rows[mode]["ttft_ms"] * rows[mode]["nfe"]
    assert rows["vanilla"]["outside_steps_ms"] is None  # the Python loop's steps are not split out
    assert rows["spiffy"]["nfe"] == rows["spiffy_device"]["nfe"] <= rows["vanilla"]["nfe"]
    assert "wrote" in capsys.readouterr().out


def test_end_to_end_arguments():
    with pytest.raises(SystemExit):
        end_to_end.main(["--device", "cpu", "--modes", "turbo"])


def test_end_to_end_steps_launched_ahead(tmp_path):
    """A device mode's ``_readK``: ``generate(steps_per_read=K)``, the same tokens and forwards as its
    Python-loop twin."""
    out = tmp_path / "ahead.json"
    assert end_to_end.main(["--device", "cpu", "--limit", "1", "--tasks", "code", "--modes",
                            "spiffy,spiffy_device_read4", "--out", str(out)]) == 0
    rows = {r["mode"]: r for r in json.loads(out.read_text())["rows"]}
    ahead = rows["spiffy_device_read4"]
    assert ahead["steps_per_read"] == 4 and rows["spiffy"]["steps_per_read"] == 1
    assert ahead["host_twin"] == "spiffy" and ahead["same_as_host_twin"] is True


def test_end_to_end_fused_boundaries(tmp_path):
    """A mode's ``_fused``: ``generate(fuse_boundaries=True)``, fewer forwards, the same tokens; the device
    loop's tokens and forwards equal its fused Python-loop twin's."""
    out = tmp_path / "fused.json"
    assert end_to_end.main(["--device", "cpu", "--limit", "1", "--tasks", "instruct", "--modes",
                            "spiffy,spiffy_fused,spiffy_device_fused,spiffy_launched_prefill", "--out", str(out)]) == 0
    rows = {r["mode"]: r for r in json.loads(out.read_text())["rows"]}
    fused = rows["spiffy_device_fused"]
    assert fused["fuse_boundaries"] is True and rows["spiffy"]["fuse_boundaries"] is False
    assert fused["host_twin"] == "spiffy_fused" and fused["same_as_host_twin"] is True
    assert rows["spiffy_fused"]["nfe"] < rows["spiffy"]["nfe"]
    assert rows["spiffy_fused"]["tokens_match"] is None  # no vanilla row asked for: no reference
    assert {r["prefill"] for r in rows.values()} == {"launched"}  # the CPU has no graphs to replay it from
    assert rows["spiffy_launched_prefill"]["nfe"] == rows["spiffy"]["nfe"]


def test_end_to_end_device_mode_alone(tmp_path):
    """A device-loop mode asked for without vanilla or its Python-loop twin: a row with nothing to compare
    its tokens with."""
    out = tmp_path / "alone.json"
    assert end_to_end.main(["--device", "cpu", "--limit", "1", "--tasks", "code", "--modes", "spiffy_device_fused",
                            "--repeats", "1", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["mode"] == "spiffy_device_fused" and row["tokens_per_s"] > 0
    assert row["tokens_match"] is None and row["host_twin"] is None and row["same_as_host_twin"] is None


def test_a_decode_counts_the_collectors_pauses():
    """``gc_ms`` / ``gc_collections``: the collections that run inside a timed decode, and only those."""
    import gc
    import types

    from specfold_compile.decoding.result import GenerateResult

    def decode(model, prompt, cuda_graphs=None, **_):
        for _ in range(3):
            gc.collect()
        return GenerateResult(tokens=[1], nfe=1, wall_time_s=0.0)

    model = types.SimpleNamespace(config=None, prefill=None, write_block=None)  # nothing of it is called
    automatic = gc.isenabled()
    gc.disable()  # only the explicit collections run: an automatic one could land inside a timed decode
    try:
        gc.collect()  # outside: not counted
        run = end_to_end._timed_run(model, None, end_to_end._Clock(False), None, {}, decode=decode)
        assert run["gc_collections"] == 3 and run["gc_ms"] > 0
        gc.collect()
        assert end_to_end._timed_run(model, None, end_to_end._Clock(False), None, {},
                                     decode=lambda *a, **k: GenerateResult([1], 1, 0.0))["gc_collections"] == 0
    finally:
        if automatic:
            gc.enable()


def test_plain_step_and_host_come_from_the_plain_passes():
    """``plain_step_ms``: the plain passes' wall less the instrumented prefills and writes, over the steps;
    ``plain_host_ms``: less also the steps' device work."""
    def run(wall_s, steps, boundary_ms, device_ms):
        return {"tokens": [1] * 10, "nfe": steps, "steps": steps, "wall_s": wall_s, "step_ms": 1.0, "host_ms": 0.5,
                "ttft_ms": 1.0, "outside_steps_ms": None, "prefill_ms": None, "boundary_ms": boundary_ms,
                "device_ms": device_ms, "gc_ms": 0.0, "gc_collections": 0, "calls": []}
    runs = {"spiffy": [[run(0.020, 4, 3.0, 8.0)] * 3, [run(0.030, 6, 5.0, 12.0)] * 3]}
    plain = [(0.045, 20), (0.040, 20), (0.050, 20)]  # the lower median: 45 ms
    row = end_to_end._row("m", "code", "spiffy", runs, 0.0, False, plain)
    assert row["tokens_per_s"] == pytest.approx(20 / 0.045)
    assert row["plain_step_ms"] == pytest.approx((45.0 - 3.0 - 5.0) / 10)
    assert row["plain_host_ms"] == pytest.approx((45.0 - 3.0 - 5.0 - 8.0 - 12.0) / 10)


def test_freeze_gc_freezes_after_the_warm_up_and_unfreezes_at_the_end(tmp_path, monkeypatch):
    import gc

    frozen = []
    monkeypatch.setattr(end_to_end, "freeze_collector", lambda: frozen.append(len(gc.get_objects())) or gc.freeze())
    out = tmp_path / "frozen.json"
    assert end_to_end.main(["--device", "cpu", "--limit", "1", "--tasks", "code", "--modes", "spiffy_device",
                            "--freeze-gc", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(frozen) == 1 and data["setup"]["freeze_gc"] is True and data["rows"][0]["freeze_gc"] is True
    assert gc.get_freeze_count() == 0  # undone when the run ends
