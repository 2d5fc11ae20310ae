"""bench.batched: the shipped model's requests recorded through the serving engine, replayed through the
engine on a random model at the record's block size, make every recorded call at every concurrency; the
rows, the plot and the report tables render from them."""
import copy
import json

import pytest
import torch

from bench import batched, plot, report
from bench.batched_clock import GcClock
from specfold_compile import kernels
from specfold_compile.serving import SERVING_MODES

FIELDS = {"model", "concurrency", "mode", "tokens_per_s", "p50_latency_ms", "p99_latency_ms", "peak_bytes",
          "trace_driven", "trace_reproduced", "requests", "tokens", "verify_calls", "rows_per_forward"}
TINY = ["--models", "tiny-fast-dllm-v2", "--override", "block_size=32,sub_block_size=8,vocab_size=1040",
        "--compile-backend", "eager"]  # Dynamo's graphs run eagerly: the compiled mode's path, no Inductor build


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("batched") / "trace.pt"
    assert batched.main(["record", "--limit", "1", "--tasks", "math,instruct", "--max-new-tokens", "40",
                         "--record-slots", "2", "--out", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def short_trace(tmp_path_factory):
    """One math request (a few calls, one with drafts): for the replays through the ragged kernel, which
    runs in the Triton interpreter here."""
    path = tmp_path_factory.mktemp("batched") / "short.pt"
    assert batched.main(["record", "--limit", "1", "--tasks", "math", "--max-new-tokens", "40",
                         "--record-slots", "2", "--out", str(path)]) == 0
    return path


def _replay(trace, out, *extra):
    assert batched.main(["replay", "--device", "cpu", "--trace", str(trace), *TINY, "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_replay_makes_the_recorded_calls_at_every_concurrency(trace, tmp_path):
    data = _replay(trace, tmp_path / "rows.json", "--concurrency", "1,3", "--requests", "3", "--per-slot", "1")
    record = torch.load(trace, weights_only=False)
    assert record["modes"] == list(SERVING_MODES) and len(record["requests"]) == 2
    spiffy = [r["spiffy"] for r in record["requests"]]
    assert any(c["accepted"] for r in spiffy for c in r["calls"]), "the record accepted no draft"
    assert any(c["rows"].shape[0] > 1 for r in spiffy for c in r["calls"])
    rows = data["rows"]
    assert data["suite"] == "batched" and "torch" in data["versions"]
    modes = list(SERVING_MODES) + [m + "_compiled" for m in SERVING_MODES]
    assert [(r["mode"], r["concurrency"]) for r in rows] == [(m, c) for m in modes for c in (1, 3)]
    for r in rows:
        assert FIELDS <= set(r) and r["trace_driven"] is True and r["trace_reproduced"] is True, r
        assert r["compiles_while_timed"] == 0  # the warm-ups compiled every graph
        assert r["requests"] == 3 and r["tokens_per_s"] > 0 and 0 < r["p50_latency_ms"] <= r["p99_latency_ms"]
        assert r["draft_budget"] == (0 if r["mode"].startswith("vanilla") else record["draft_budget"])
        recs = [record["requests"][j % 2][r["mode"].removesuffix("_compiled")] for j in range(3)]
        assert r["tokens"] == sum(len(x["tokens"]) for x in recs)
        calls = sum(len(x["calls"]) for x in recs)
        if r["concurrency"] == 1:  # one request at a time: one forward a recorded call
            assert r["verify_calls"] == calls and r["requests_per_forward"] == 1
        else:  # batched: fewer forwards, the same rows
            assert r["verify_calls"] < calls and r["requests_per_forward"] > 1
        biggest = max(int(c["rows"].shape[0]) for x in recs for c in x["calls"])
        assert r["max_rows_per_forward"] >= biggest and r["max_rows_per_forward"] >= r["rows_per_forward"]
        if r["concurrency"] == 1:  # one request a forward: its biggest call
            assert r["max_rows_per_forward"] == biggest
        assert 0 < r["max_logit_positions"] <= 32 * r["max_rows_per_forward"]
        assert r["rows_per_forward"] * r["verify_calls"] == pytest.approx(
            sum(int(c["rows"].shape[0]) for x in recs for c in x["calls"]))


def test_a_replay_off_its_record_is_not_reproduced(trace, tmp_path):
    record = torch.load(trace, weights_only=False)
    bad = copy.deepcopy(record)
    call = bad["requests"][0]["vanilla"]["calls"][0]
    call["state"][call["state"] == record["mask_token_id"]] = record["eos_token_id"]  # ends the request early
    path = tmp_path / "bad.pt"
    torch.save(bad, path)
    rows = _replay(path, tmp_path / "bad.json", "--modes", "vanilla", "--concurrency", "2", "--requests", "2", "--per-slot", "1")["rows"]
    assert [(r["mode"], r["trace_reproduced"]) for r in rows] == [("vanilla", False)]
    assert rows[0]["verify_calls"] < len(record["requests"][1]["vanilla"]["calls"]) + len(
        record["requests"][0]["vanilla"]["calls"])


def test_each_attention_path_replays_the_record(short_trace, tmp_path):
    """``--attention per_request,ragged``: a row set per path, each request making its recorded calls
    (vanilla: the ragged kernel runs interpreted here; SpecFold's ragged replay is the capacity test's)."""
    rows = _replay(short_trace, tmp_path / "att.json", "--modes", "vanilla", "--attention", "per_request,ragged",
                   "--concurrency", "2", "--requests", "2", "--per-slot", "1")["rows"]
    assert [(r["mode"], r["attention"]) for r in rows] == [("vanilla", "per_request"), ("vanilla", "ragged")]
    assert all(r["trace_reproduced"] is True for r in rows) and rows[0]["tokens"] == rows[1]["tokens"]
    assert [plot.serving_series(r) for r in rows] == ["vanilla", "vanilla+ragged"]


def test_poisson_arrivals(trace, tmp_path):
    rows = _replay(trace, tmp_path / "p.json", "--modes", "spiffy", "--concurrency", "2", "--requests", "3", "--per-slot", "1",
                   "--arrival", "poisson", "--rate", "50")["rows"]
    assert rows[0]["arrival"] == "poisson 50/s" and rows[0]["trace_reproduced"] is True
    assert rows[0]["wall_s"] > 0 and rows[0]["p99_latency_ms"] > 0


def test_requests_decode_every_token_without_the_eos_stop(tmp_path):
    path = tmp_path / "long.pt"
    assert batched.main(["record", "--limit", "1", "--tasks", "math", "--max-new-tokens", "40", "--no-eos-stop",
                         "--modes", "spiffy", "--out", str(path)]) == 0
    rows = _replay(path, tmp_path / "long.json", "--concurrency", "2", "--requests", "2", "--per-slot", "1")["rows"]
    assert [r["mode"] for r in rows] == ["spiffy", "spiffy_compiled"]  # the recorded mode, and compiled
    assert all(r["trace_reproduced"] is True and r["tokens"] == 2 * 40 for r in rows)


def test_a_record_of_fewer_drafts_replays_as_its_own_series(tmp_path):
    path = tmp_path / "b1.pt"
    assert batched.main(["record", "--limit", "1", "--tasks", "math", "--max-new-tokens", "40", "--draft-budget", "1",
                         "--modes", "spiffy", "--out", str(path)]) == 0
    record = torch.load(path, weights_only=False)
    assert all(c["rows"].shape[0] <= 2 for r in record["requests"] for c in r["spiffy"]["calls"])
    rows = _replay(path, tmp_path / "b1.json", "--modes", "spiffy", "--concurrency", "2", "--requests", "2",
                   "--per-slot", "1")["rows"]
    assert rows[0]["trace_reproduced"] is True and rows[0]["draft_budget"] == 1
    assert rows[0]["max_rows_per_forward"] <= 4 and plot.serving_series(rows[0]) == "spiffy+drafts 1"
    default = {**rows[0], "draft_budget": 16}
    assert plot.serving_series(default) == "spiffy" and plot._point(default) != plot._point(rows[0])
    assert report.render_batched_headline({"rows": [default, rows[0]]})[0].endswith(
        "| Spiffy, eager, 1 draft a call (tokens/s) | Spiffy, eager, 1 draft a call p50 / p99 (ms) |")


def test_a_record_with_a_row_limit_replays_its_own_steps(tmp_path):
    """``--max-verify-rows``: made at the replay's concurrency and workload, every forward of the record
    and of its replay holds at most the limit's rows (three requests, four rows: no drafts while all three
    run), and the rows are a series of their own."""
    path = tmp_path / "r4.pt"
    assert batched.main(["record", "--limit", "1", "--tasks", "math,instruct", "--max-new-tokens", "40",
                         "--modes", "spiffy", "--max-verify-rows", "4", "--record-slots", "3",
                         "--record-requests", "3", "--out", str(path)]) == 0
    record = torch.load(path, weights_only=False)
    assert record["max_verify_rows"] == 4 and len(record["requests"]) == 3
    assert record["requests"][0]["prompt"].tolist() == record["requests"][2]["prompt"].tolist()
    calls = [c for r in record["requests"] for c in r["spiffy"]["calls"]]
    assert max(c["rows"].shape[0] for c in calls) <= 4 and any(c["rows"].shape[0] > 1 for c in calls)
    rows = _replay(path, tmp_path / "r4.json", "--modes", "spiffy", "--concurrency", "3", "--requests", "3",
                   "--per-slot", "1", "--loop", "host,device")["rows"]
    assert [r["loop"] for r in rows] == ["host", "device"]  # the device loop cuts its calls as the record's
    assert all(r["trace_reproduced"] is True and r["max_verify_rows"] == 4 for r in rows)
    assert rows[1]["max_rows_per_forward"] == rows[0]["max_rows_per_forward"]
    assert rows[0]["max_rows_per_forward"] <= 4 and plot.serving_series(rows[0]) == "spiffy+rows 4"
    with pytest.raises(SystemExit, match=r"replays as it was made, on 3 slots with 3 requests; got \(slots, "
                                         r"requests\) \[\(2, 3\)\]"):
        _replay(path, tmp_path / "off.json", "--modes", "spiffy", "--concurrency", "2", "--requests", "3",
                "--per-slot", "1")
    free = {**rows[0], "max_verify_rows": None}
    assert plot._point(free) != plot._point(rows[0])
    assert report.render_batched_headline({"rows": [rows[0]]})[0].endswith(
        "| Spiffy, eager, at most 4 rows a forward (tokens/s) | Spiffy, eager, at most 4 rows a forward p50 / p99 (ms) |")


def test_a_point_out_of_memory_is_named_and_the_others_run(trace, tmp_path, monkeypatch):
    serve = batched.serve

    def failing(model, mode, concurrency, *args):
        if concurrency == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9 GiB")
        return serve(model, mode, concurrency, *args)
    monkeypatch.setattr(batched, "serve", failing)
    data = _replay(trace, tmp_path / "oom.json", "--modes", "vanilla", "--concurrency", "1,3,2", "--per-slot", "1",
                   "--requests", "2")
    assert [r["concurrency"] for r in data["rows"]] == [1, 2]
    assert data["setup"]["out_of_memory"] == [{"model": "tiny-fast-dllm-v2", "mode": "vanilla", "attention": "per_request",
                                               "concurrency": 3, "loop": "host"}]


def test_argument_errors(trace, tmp_path, capsys):
    for argv, word in ((["--modes", "dense"], "--modes"), (["--arrival", "poisson"], "--rate"),
                       (["--concurrency", "0"], "--concurrency"), (["--attention", "paged"], "--attention")):
        with pytest.raises(SystemExit) as exc:
            batched.main(["replay", "--device", "cpu", "--trace", str(trace), "--out", str(tmp_path / "x.json"), *argv])
        assert exc.value.code == 2 and word in capsys.readouterr().err
    with pytest.raises(SystemExit, match="block size 16, the record's is 32"):
        batched.main(["replay", "--device", "cpu", "--trace", str(trace), "--models", "tiny-fast-dllm-v2",
                      "--out", str(tmp_path / "x.json")])


def _fake_rows() -> list[dict]:
    rows = []
    for model, scale in (("fast-dllm-v2-1.5b", 2.0), ("fast-dllm-v2-7b", 1.0)):
        for mode, gain in (("vanilla", 1.0), ("spiffy", 1.5)):
            for c in (1, 4, 16, 64):
                rows.append({"model": model, "concurrency": c, "mode": mode, "tokens_per_s": 100.0 * scale * gain * c,
                             "p50_latency_ms": 10.0 * c, "p99_latency_ms": 20.0 * c, "peak_bytes": 3 * 2**30,
                             "pool_bytes": 2**30, "requests": max(16, c), "rows_per_forward": 2.0 * c,
                             "max_rows_per_forward": 3 * c,
                             "trace_driven": True, "trace_reproduced": True, "arrival": "closed"})
    return rows


def test_plot_and_report_render_from_a_results_file(tmp_path):
    (tmp_path / "h200").mkdir()
    path = tmp_path / "h200" / "batched.json"
    path.write_text(json.dumps({"versions": {"gpu": "G", "torch": "t"}, "suite": "batched", "rows": _fake_rows()}))
    assert plot.plot_results(path).stat().st_size > 0
    table = report.render_batched_headline(json.loads(path.read_text()))
    assert table[0].startswith("| shape | concurrency | vanilla (tokens/s) | vanilla p50 / p99 (ms) | Spiffy")
    assert table[2:4] == ["| 1.5B | 1 | 200 | 10 / 20 | 300 | 10 / 20 |", "| 1.5B | 4 | 800 | 40 / 80 | 1200 | 40 / 80 |"]
    assert len(table) == 2 + 8
    page = report.render(tmp_path)
    assert "## Many requests at once" in page and "| 7B | Spiffy, eager | 64 | 64 | 9600 | 640.0 | 1280.0 | 128.0 / 192 | 3.0" \
        in page and "batched.png" in page
    # merging runs keeps every concurrency (a point is model, mode, concurrency)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"suite": "batched", "rows": _fake_rows()[:2]}))
    merged = json.loads(plot.merge_results(tmp_path / "m.json", [path, other]).read_text())
    assert len(merged["rows"]) == len(_fake_rows())


def test_a_specfold_replay_forces_the_recorded_fold_masks(trace, tmp_path, monkeypatch):
    """Every replayed SpecFold forward folds the record's masks (gates mapped onto the replay model's)."""
    from specfold_compile.serving import engine

    record = torch.load(trace, weights_only=False)
    calls = [c for r in record["requests"] for c in r["specfold"]["calls"]]
    assert all(c["fold_masks"] is not None for c in calls) and any(c["fold_masks"][:, 1:].any() for c in calls)
    seen, real = [], engine.verify_batch_folded

    def spy(*args, **kwargs):
        seen.append(args[7])
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "verify_batch_folded", spy)
    data = _replay(trace, tmp_path / "sf.json", "--modes", "specfold", "--concurrency", "1", "--requests", "2",
                   "--per-slot", "1")
    assert data["rows"][0]["trace_reproduced"] is True
    assert all(forced is not None and len(forced) == 1 for forced in seen)  # one request a forward here
    drafted = [c for c in calls if c["rows"].shape[0] > 1]  # a call without drafts runs the plain forward
    assert all(not c["fold_masks"].any() for c in calls if c["rows"].shape[0] == 1)
    timed = [forced[0] for forced in seen[-len(drafted):]]  # the timed run: request 0's calls, then request 1's
    assert len(timed) == len(drafted)
    for m, c in zip(timed, drafted):
        g_rec, g = c["fold_masks"].shape[0], m.shape[0]
        assert torch.equal(m, c["fold_masks"][[i * g_rec // g for i in range(g)]])


def test_the_report_keeps_the_attention_paths_apart():
    rows = _fake_rows()[:1]
    rows.append({**rows[0], "mode": "specfold", "attention": "ragged", "tokens_per_s": 321.0})
    rows.append({**rows[0], "mode": "specfold", "attention": "per_request", "tokens_per_s": 123.0})
    table = report.render_batched_headline({"rows": rows})
    assert table[0] == ("| shape | concurrency | vanilla (tokens/s) | vanilla p50 / p99 (ms) | SpecFold, ragged (tokens/s) "
                        "| SpecFold, ragged p50 / p99 (ms) | SpecFold (tokens/s) | SpecFold p50 / p99 (ms) |")
    assert table[2] == "| 1.5B | 1 | 200 | 10 / 20 | 321 | 10 / 20 | 123 | 10 / 20 |"
    assert len({plot._point(r) for r in rows}) == 3  # a merge keeps both paths' rows


def test_pool_tokens_size_the_pool_and_a_profile_is_written(trace, tmp_path):
    args = ["--modes", "vanilla", "--concurrency", "2", "--requests", "2", "--per-slot", "1"]
    plain = _replay(trace, tmp_path / "plain.json", *args)["rows"][0]
    big = _replay(trace, tmp_path / "big.json", *args, "--pool-tokens", "1024", "--profile", str(tmp_path / "prof"))
    row = big["rows"][0]
    assert row["trace_reproduced"] is True and row["pool_bytes"] > plain["pool_bytes"]
    table = (tmp_path / "prof" / "tiny-fast-dllm-v2_vanilla_per_request_c2.txt").read_text()
    assert "Self CPU" in table and "aten::" in table


def test_freeze_gc_freezes_for_the_timed_runs_only(trace, tmp_path, monkeypatch):
    """``--freeze-gc``: the collector frozen after the warm-up, the rows say so, unfrozen afterwards."""
    import gc

    frozen_in_runs = []
    real_serve = batched.serve

    def watched(*a, **kw):
        frozen_in_runs.append(gc.get_freeze_count() > 0)
        return real_serve(*a, **kw)
    monkeypatch.setattr(batched, "serve", watched)
    data = _replay(trace, tmp_path / "f.json", "--modes", "vanilla", "--concurrency", "2", "--requests", "2",
                   "--per-slot", "1", "--repeats", "2", "--freeze-gc")
    (row,) = data["rows"]
    assert row["freeze_gc"] is True and row["trace_reproduced"] is True
    assert frozen_in_runs[-2:] == [True, True] and not frozen_in_runs[0]  # the warm-up ran unfrozen
    assert gc.get_freeze_count() == 0


def test_cuda_graphs_replay_the_record_and_lead_the_headline(short_trace, tmp_path):
    """``--cuda-graphs off,on``: the engine launched and replayed (``cuda_graphs="eager"`` on the CPU), all
    making the recorded calls, the replayed one with the engine's ``rows_ahead`` on and off (``--rows-ahead
    on,off``, the same graphs; off is a series of its own); the README headline keeps the replayed rows only."""
    rows = _replay(short_trace, tmp_path / "graphs.json", "--modes", "vanilla", "--attention", "ragged", "--cuda-graphs",
                   "off,on", "--rows-ahead", "on,off", "--concurrency", "2", "--requests", "2", "--per-slot", "1")["rows"]
    assert [(r["mode"], r["cuda_graphs"], r.get("rows_ahead")) for r in rows] == [
        ("vanilla", False, None), ("vanilla", True, True), ("vanilla", True, False)]
    assert all(r["trace_reproduced"] is True for r in rows) and rows[0]["tokens"] == rows[1]["tokens"] == rows[2]["tokens"]
    ahead_off, rows = rows[2], rows[:2]
    assert plot.serving_series(ahead_off) == "vanilla+ragged+graphs+no rows ahead"
    assert plot._point(ahead_off) != plot._point(rows[1])  # a merge keeps both
    assert "| vanilla, CUDA graphs, rows built after each write (tokens/s) |" in report.render_batched_headline(
        {"rows": [ahead_off]})[0]
    assert rows[1]["captures_while_timed"] == 0  # the warm-up captured every bucket the timed run used
    # with graphs the wall time splits into the passes and the host's rest (bench/batched_clock.py)
    parts = [rows[1][k] for k in ("verify_s", "write_s", "prefill_s", "host_s")]
    assert rows[1]["verify_s"] > 0 and min(parts) >= 0 and abs(sum(parts) - rows[1]["wall_s"]) < 1e-6
    assert "verify_s" not in rows[0]  # launched: not split
    assert all(r["gc_s"] >= 0 and r["gc_collections"] >= r["gc_full"] >= 0 for r in rows)  # every row
    assert [plot.serving_series(r) for r in rows] == ["vanilla+ragged", "vanilla+ragged+graphs"]
    table = report.render_batched_headline({"rows": rows})
    assert table[0] == "| shape | concurrency | vanilla, CUDA graphs (tokens/s) | vanilla, CUDA graphs p50 / p99 (ms) |"
    assert len({plot._point(r) for r in rows}) == 2  # a merge keeps both


def test_fold_capacity_record_gives_a_share_a_gate(short_trace, tmp_path):
    """``--fold-capacity record --min-packed 0``: SpecFold's graphs packing each gate's share of the
    record's computed positions (``capacity_from_masks`` over the forced masks), their own series; the
    recorded calls made on both loops (the device loop's folded forward not waited for). (One request: the
    graphs' ragged attention runs in the interpreter here.)"""
    rows = _replay(short_trace, tmp_path / "capacity.json", "--modes", "specfold", "--cuda-graphs", "on", "--attention",
                   "ragged", "--fold-capacity", "record", "--min-packed", "0", "--capacity-spread", "2",
                   "--concurrency", "1", "--requests", "1", "--per-slot", "1", "--loop", "host,device")["rows"]
    assert [(r["fold_capacity"], r["min_packed"], r["capacity_spread"], r["loop"]) for r in rows] == [
        ("record", 0, 2.0, "host"), ("record", 0, 2.0, "device")]
    assert all(r["trace_reproduced"] is True for r in rows)
    assert rows[1]["verify_calls"] == rows[0]["verify_calls"] and rows[1]["tokens"] == rows[0]["tokens"]
    shares = rows[0]["fold_shares"]
    assert isinstance(shares, list) and all(0 < s <= 1 for s in shares)
    half = {**rows[0], "fold_capacity": "0.5", "fold_shares": 0.5}
    assert [plot.serving_series(r) for r in (half, rows[0])] == ["specfold+ragged+graphs",
                                                                 "specfold+ragged+graphs+capacity record"]
    assert len({plot._point(r) for r in (half, rows[0])}) == 2  # a merge keeps both
    header = report.render_batched_headline({"rows": [half, rows[0], {**half, "fold_capacity": "record:1.5"}]})[0]
    assert "SpecFold, CUDA graphs, capacity a gate (tokens/s)" in header
    assert "SpecFold, CUDA graphs, capacity a gate x 1.5 (tokens/s)" in header
    # the gates resolved by the Triton kernel where it runs (here the interpreter), else by tensor ops
    assert all(r["gate_kernel"] is kernels.triton_available() for r in rows)
    ops_gates = {**rows[0], "gate_kernel": False}
    assert plot.serving_series(ops_gates) == "specfold+ragged+graphs+capacity record+tensor-op gates"
    assert plot._point(ops_gates) != plot._point(rows[0])  # a merge keeps both
    assert "SpecFold, CUDA graphs, capacity a gate, gates by tensor ops (tokens/s)" in \
        report.render_batched_headline({"rows": [ops_gates]})[0]


def test_fold_capacity_values_are_checked(capsys):
    for bad in ("0", "1.5", "record:0", "half"):
        with pytest.raises(SystemExit):
            batched.main(["replay", "--device", "cpu", "--trace", "t.pt", "--fold-capacity", f"0.5,{bad}"])
        assert "--fold-capacity: expected numbers in (0, 1], 'record' or 'record:MARGIN'" in capsys.readouterr().err


def test_the_device_loop_replays_the_record(trace, tmp_path):
    """``--loop host,device``: ``Engine(loop="device")`` runs each step's bookkeeping on the replay model's
    confidences, then the recorded next calls go into its slot buffers; every mode makes its recorded calls
    and the two loops' rows are their own series."""
    modes = ("vanilla", "spiffy", "specfold")
    rows = _replay(trace, tmp_path / "loop.json", "--modes", ",".join(modes), "--loop", "host,device",
                   "--concurrency", "2", "--requests", "3", "--per-slot", "1")["rows"]
    assert [(r["mode"], r["loop"]) for r in rows] == [(m, loop) for m in modes for loop in ("host", "device")]
    assert all(r["trace_reproduced"] is True for r in rows)
    for host, device in zip(rows[::2], rows[1::2]):
        same = ("tokens", "verify_calls", "rows_per_forward", "max_rows_per_forward", "max_logit_positions")
        assert [device[k] for k in same] == [host[k] for k in same]  # the same forwards, the same logits asked
        assert device["compile_step"] is False  # on the CPU: Engine(loop="device")'s bookkeeping is not compiled
        assert plot.serving_series(device) == device["mode"] + "+device loop, eager step"
        assert plot._point(host) != plot._point(device)
        assert plot._point(host) == plot._point({k: v for k, v in host.items() if k != "loop"})  # older rows: host
    header = report.render_batched_headline({"rows": rows[2:4]})[0]
    assert "| Spiffy, eager, device loop, eager step (tokens/s) |" in header
    compiled = {**rows[3], "compile_step": True}  # the bookkeeping compiled (CUDA graphs): its own series and point
    assert plot.serving_series(compiled) == "spiffy+device loop" and plot._point(compiled) != plot._point(rows[3])
    assert "| Spiffy, eager, device loop (tokens/s) |" in report.render_batched_headline(
        {"rows": [rows[2], compiled]})[0]


def test_gc_clock_counts_the_collections_of_its_run():
    """``GcClock``: the collections between its creation and ``read()``, full ones apart, their time; no
    callback left behind."""
    import gc

    before = len(gc.callbacks)
    clock = GcClock()
    gc.collect(0)
    gc.collect()
    got = clock.read()
    assert got["gc_collections"] == 2 and got["gc_full"] == 1 and got["gc_s"] > 0
    assert len(gc.callbacks) == before
    gc.collect()
    assert clock.read() == got  # nothing counted after the first read
