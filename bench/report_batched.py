"""The serving engine's tables of the benchmark page (``bench.batched`` rows): every row, and the
headline table of tokens/s and latency per shape, concurrency and series (a mode on an attention path,
``bench.plot.serving_series``)."""

from __future__ import annotations

from bench.plot import serving_series
from bench.tables import E2E_MODES, SHAPES, fmt, markdown_table, matching

# bench.batched.replay_modes, in words; vanilla first so that its compiled twin sorts next to it
SERVED_MODES = {"vanilla": E2E_MODES["vanilla"], "vanilla_compiled": "vanilla, Inductor", **E2E_MODES,
                "specfold_compiled": "SpecFold, Inductor"}


def _series(data: dict) -> list[str]:
    """The rows' series, launched before replayed, each in ``SERVED_MODES``' order."""
    order = list(SERVED_MODES)
    series = dict.fromkeys(serving_series(r) for r in data["rows"])
    return sorted(series, key=lambda s: ("+graphs" in s, order.index(s.split("+")[0]) if s.split("+")[0] in order
                                         else len(order)))


def _series_label(series: str) -> str:
    for loop in ("+device loop", "+device loop, eager step"):  # Engine(loop="device"): the bookkeeping on the device
        if series.endswith(loop):
            return _series_label(series.removesuffix(loop)) + ", " + loop[1:]
    if series.endswith("+no rows ahead"):  # the engine's rows_ahead off
        return _series_label(series.removesuffix("+no rows ahead")) + ", rows built after each write"
    if series.endswith("+tensor-op gates"):  # BatchGraphs(gate_kernel=False)
        return _series_label(series.removesuffix("+tensor-op gates")) + ", gates by tensor ops"
    if series.endswith("+packed attention"):  # BatchGraphs(packed_attention=True)
        return _series_label(series.removesuffix("+packed attention")) + ", attention over the packed rows"
    mode, *paths = series.split("+")
    rows = next((p.removeprefix("rows ") for p in paths if p.startswith("rows ")), None)
    if rows is not None:  # Engine(max_verify_rows=R): drafts cut under load
        return _series_label(series.removesuffix(f"+rows {rows}")) + f", at most {rows} rows a forward"
    drafts = next((p.removeprefix("drafts ") for p in paths if p.startswith("drafts ")), None)
    if drafts is not None:  # a record of another draft budget than the default
        word = "draft" if drafts == "1" else "drafts"
        return _series_label(series.removesuffix(f"+drafts {drafts}")) + f", {drafts} {word} a call"
    capacity = next((p.removeprefix("capacity ") for p in paths if p.startswith("capacity ")), None)
    if capacity is not None:  # SpecFold's graphs packing another share than the default's
        if capacity.startswith("record"):  # record:M, each gate's mean share times M
            word = ", capacity a gate" + (f" x {capacity.removeprefix('record:')}" if ":" in capacity else "")
        else:
            word = f", capacity {capacity}"
        return _series_label(series.removesuffix(f"+capacity {capacity}")) + word
    if "graphs" in paths:  # the graphs replay the ragged kernel
        return SERVED_MODES.get(mode, mode) + ", CUDA graphs"
    return SERVED_MODES.get(mode, mode) + (", ragged" if "ragged" in paths else "")


def _gib(x: int | None) -> str:
    return "" if x is None else f"{x / 2**30:.1f}"


def render_batched_headline(data: dict) -> list[str]:
    """README's serving table: per shape and concurrency, each mode's tokens/s over all requests and its
    p50 / p99 request latency; only the rows replayed from CUDA graphs when there are some (the engine's
    fastest path: the launched rows are on the benchmark page)."""
    if any(r.get("cuda_graphs") for r in data["rows"]):
        data = {**data, "rows": [r for r in data["rows"] if r.get("cuda_graphs")]}
    modes = _series(data)
    rows = []
    for model in dict.fromkeys(r["model"] for r in data["rows"]):
        for c in sorted({r["concurrency"] for r in matching(data, model=model)}):
            cells = []
            for mode in modes:
                r = next((r for r in matching(data, model=model, concurrency=c) if serving_series(r) == mode), None)
                cells += ["", ""] if r is None else [
                    f"{r['tokens_per_s']:.0f}", f"{r['p50_latency_ms']:.0f} / {r['p99_latency_ms']:.0f}"]
            rows.append([SHAPES.get(model, model), str(c)] + cells)
    header = ["shape", "concurrency"]
    for mode in modes:
        header += [f"{_series_label(mode)} (tokens/s)", f"{_series_label(mode)} p50 / p99 (ms)"]
    return markdown_table(header, rows)


def render_batched(data: dict) -> list[str]:
    rows = [[SHAPES.get(r["model"], r["model"]), _series_label(serving_series(r)), str(r["concurrency"]),
             str(r["requests"]), f"{r['tokens_per_s']:.0f}", fmt(r["p50_latency_ms"], 1), fmt(r["p99_latency_ms"], 1),
             f"{r['rows_per_forward']:.1f} / {r['max_rows_per_forward']}", _gib(r["peak_bytes"]), _gib(r["pool_bytes"]),
             "yes" if r["trace_reproduced"] else "NO"] for r in data["rows"]]
    arrival = data["rows"][0]["arrival"]
    header = ["shape", "mode", "concurrency", "requests", "tokens/s", "p50 latency (ms)", "p99 latency (ms)",
              "rows per forward (mean / max)", "peak memory (GiB)", "KV pool (GiB)", "trace reproduced"]
    return [f"Arrivals: {arrival}.", ""] + markdown_table(header, rows) + [""]


def render_packed_rows(data: dict) -> list[str]:
    """One decoder layer's position-wise GEMMs by packed row count, a column a shape (``bench.packed_rows``)."""
    models = list(dict.fromkeys(r["model"] for r in data["rows"]))
    counts = sorted({r["rows"] for r in data["rows"]})
    cell = {(r["model"], r["rows"]): r for r in data["rows"]}
    rows = [[str(n)] + [("" if (m, n) not in cell else
                         f"{cell[m, n]['us']:.0f} ({cell[m, n]['us_per_row']:.2f} a row)") for m in models]
            for n in counts]
    return markdown_table(["packed rows"] + [f"{SHAPES.get(m, m)} (us)" for m in models], rows) + [""]
