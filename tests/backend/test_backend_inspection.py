"""What the backend tells about a compile: the record per graph (regions, passes, compile time) and its
repr, tlparse's structured trace, the compile time at INFO and the progress line of a long compile."""
import json
import logging
import re

import pytest
import torch

from specfold_compile.testing import ModelSpec, make_cache, make_tree
from specfold_compile.backend import SpecFoldBackend, collect_stats, logs
from specfold_compile.passes import REWRITES

REWRITE_NAMES = [name for name, _ in REWRITES]


@pytest.fixture(scope="module")
def tiny():
    model = ModelSpec(family="fast-dllm-v2", layers=2, block=8, seed=1).build()
    cache = make_cache(model)
    tokens, parents = make_tree(model, 4, "realistic", 3)
    return model, tokens, parents, cache


def _compile(tiny, **options):
    model, tokens, parents, cache = tiny
    backend = SpecFoldBackend(tau=0.3, kernels="torch", **options)
    with collect_stats() as s:
        torch.compile(model, backend=backend)(tokens, parents, cache)
    assert s.calls == 1, "the folded graph did not run"
    (record,) = backend.graphs
    return record


def test_record_holds_regions_passes_and_compile_time(tiny):
    record = _compile(tiny)
    assert [r.label for r in record.regions] == ["layer 0", "layer 1"]
    assert [r.module for r in record.regions] == ["model.layers.0", "model.layers.1"]
    assert all(r.ops > 0 and r.rewritten[-1].startswith("kernels=torch") for r in record.regions)
    assert [p.name for p in record.passes] == REWRITE_NAMES
    for earlier, later in zip(record.passes, record.passes[1:]):
        assert earlier.ops_after == later.ops_before
    gates = record.passes[0]
    assert gates.ops_after - gates.ops_before == 2 + 1  # a gate per layer and the tau constant
    assert record.passes[-1].ops_after == record.passes[-1].ops_before - 1  # the marker
    assert record.compile_seconds >= sum(p.seconds for p in record.passes) > 0
    text = repr(record)
    assert text.startswith(f"GraphRecord(compile {record.compile_id} of {record.function}: folded, compiled in ")
    assert "\n  region layer 0 (model.layers.0): " in text and "\n  fold plan: fold every multi-branch" in text
    assert "\n  passes: insert_gates " in text and "strip_marker" in text and text.endswith(")")


def test_compile_time_logged_at_info(tiny, caplog):
    with caplog.at_level(logging.INFO, logger="specfold_compile"):
        record = _compile(tiny)
    lines = [r.getMessage() for r in caplog.records if r.name == "specfold_compile" and r.levelno == logging.INFO]
    assert any(m.startswith(f"specfold: compiled graph {record.compile_id} of ") and m.endswith("s (folded)")
               for m in lines), lines


def test_structured_trace_for_tlparse(tiny):
    entries = []

    class Collect(logging.Handler):
        def emit(self, record):
            entries.append((record.metadata, record.payload))

    trace_log = torch._logging._internal.trace_log
    handler = Collect()
    trace_log.addHandler(handler)
    try:
        record = _compile(tiny)
    finally:
        trace_log.removeHandler(handler)
    dumps = [m["graph_dump"]["name"] for m, _ in entries if "graph_dump" in m]
    ours = [d for d in dumps if d.startswith("specfold_")]
    assert ours == [f"specfold_{i:02d}_{n}" for i, n in enumerate(["input"] + REWRITE_NAMES)]
    artifacts = {m["artifact"]["name"]: (m["artifact"]["encoding"], p) for m, p in entries if "artifact" in m}
    encoding, report = artifacts["specfold_region_report"]
    assert encoding == "string" and report == record.report
    encoding, payload = artifacts["specfold_graph_record"]
    data = json.loads(payload)
    assert encoding == "json" and data["compile_id"] == record.compile_id and data["folded"] is True
    assert [p["name"] for p in data["passes"]] == REWRITE_NAMES
    assert all(m.get("frame_id") is not None for m, _ in entries if "specfold" in json.dumps(m))


def test_progress_line_for_a_long_compile(tiny, capsys, monkeypatch):
    monkeypatch.setattr(logs, "PROGRESS_AFTER_S", 0.0)
    record = _compile(tiny)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specfold:")]
    assert len(lines) == 1, lines
    assert re.fullmatch(rf"specfold: (still compiling|compiled) graph {re.escape(record.compile_id)} of .*", lines[0])
    monkeypatch.setattr(logs, "PROGRESS_AFTER_S", 1e6)
    torch._dynamo.reset()
    _compile(tiny)
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("specfold:")]
