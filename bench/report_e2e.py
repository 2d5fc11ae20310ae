"""``bench.report``'s decode-loop tables: one step's verification call, whole decodes (the trace-driven
rows at real shapes, the shipped model's rows) and README's headline."""

from __future__ import annotations

from bench.tables import E2E_MODES, SHAPES
from bench.tables import first_matching as _one, fmt as _f, markdown_table as _table, matching as _rows

_YES = {True: "yes", False: "NO", None: "-"}
BOUNDARIES = {False: "separate", True: "fused", "writes": "fused writes"}  # generate(fuse_boundaries=...) of a row


def _e2e_ratio(data: dict, row: dict) -> str:
    base = _one(data, model=row["model"], task=row["task"], mode="spiffy_compiled", trace_driven=row["trace_driven"],
                fuse_boundaries=row.get("fuse_boundaries"))
    return f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else ""


def _against_launched_prefill(data: dict, row: dict) -> str:
    """A shipped-model row's tokens/s over its compiled model's in the Python loop with the prefill launched
    (the mode's root, e.g. ``specfold`` for ``specfold_device_fused``, then ``_launched_prefill``)."""
    root = row["mode"]
    for suffix in ("_launched_prefill", "_fused", "_device"):
        root = root.removesuffix(suffix)
    base = _one(data, task=row["task"], mode=f"{root}_launched_prefill", trace_driven=False)
    return f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else ""


def render_e2e_headline(data: dict) -> list[str]:
    """README's table: trace-driven tokens/s per shape, task and block-boundary handling (separate or all
    fused; the writes-only rows are on the benchmark page), each mode, SpecFold against Spiffy under
    Inductor in the same loop."""
    rows = []
    for model in SHAPES:
        for fused in (f for f in BOUNDARIES if f != "writes"):
            for task in dict.fromkeys(r["task"] for r in _rows(data, model=model, trace_driven=True)):
                by_mode = {m: _one(data, model=model, task=task, mode=m, trace_driven=True, fuse_boundaries=fused)
                           for m in E2E_MODES}
                if not all(by_mode.values()):
                    continue
                sf = by_mode["specfold"]
                rows.append([SHAPES[model], task, BOUNDARIES[fused]]
                            + [f"{by_mode[m]['tokens_per_s']:.0f}" for m in E2E_MODES]
                            + [_e2e_ratio(data, sf), f"{100 * sf['host_ms'] / sf['step_ms']:.0f}%"])
    return _table(["shape", "task", "block boundaries"] + [f"{w} (tokens/s)" for w in E2E_MODES.values()]
                  + ["SpecFold / Spiffy, Inductor", "host share of a SpecFold step"], rows)


def render_end_to_end(data: dict) -> list[str]:
    lines = []
    traced = [r for r in data["rows"] if r["trace_driven"]]
    if traced:
        lines += ["Trace-driven at the real shapes (random bf16 weights; every call, seed, fold mask and accepted "
                  "draft forced from the shipped model's record; trace reproduced: the replay made exactly the "
                  "recorded calls and tokens):", ""]
        lines += _table(["shape", "task", "block boundaries", "mode", "tokens/s", "NFE", "step (ms)", "host (ms)",
                         "prefill (ms)", "TTFT (ms)", "/ Spiffy, Inductor", "trace reproduced"],
                        [[SHAPES.get(r["model"], r["model"]), r["task"], BOUNDARIES[r.get("fuse_boundaries") or False],
                          E2E_MODES[r["mode"]],
                          f"{r['tokens_per_s']:.0f}", _f(r["nfe"]), _f(r["step_ms"]), _f(r["host_ms"]),
                          _f(r.get("prefill_ms")), _f(r["ttft_ms"], 1), _e2e_ratio(data, r),
                          "yes" if r["trace_reproduced"] else "NO"]
                         for r in traced])
        lines += [""]
    shipped = [[r["task"], r["mode"], r.get("loop", ""), r.get("prefill", "launched"), f"{r['tokens_per_s']:.0f}",
                _f(r["nfe"]), _f(r["step_ms"]), _f(r["host_ms"]), _f(r.get("prefill_ms")), _f(r["ttft_ms"], 1),
                _against_launched_prefill(data, r),
                f'{_YES[r.get("tokens_match")]} / {_YES[r.get("same_as_host_twin")]}']
               for r in data["rows"] if not r["trace_driven"]]
    if shipped:
        lines += ["The shipped model itself (its own acceptance; `bench.end_to_end`): the Python loop "
                  "(`loop=\"host\"`) against the device loop (`*_device`), CUDA graphs on; the ratio column is "
                  "against the same compiled model in the Python loop with its prefill launched (`*_launched_prefill`, "
                  "where the run has it):", ""]
        lines += _table(["task", "mode", "loop", "prefill", "tokens/s", "NFE", "step (ms)", "host (ms)",
                         "prefill (ms)", "TTFT (ms)", "/ Python loop, launched prefill",
                         "same tokens as vanilla / as the Python loop"], shipped) + [""]
    return lines


def render_decode_loop(data: dict) -> list[str]:
    rows = []
    for model in SHAPES:
        for n in sorted({r["n_branches"] for r in _rows(data, part="shape", model=model)}):
            sp = _one(data, part="shape", model=model, n_branches=n, mode="spiffy_compiled")
            sf = _one(data, part="shape", model=model, n_branches=n, mode="specfold")
            if not (sp and sf):
                continue
            rows.append([SHAPES[model], str(n), _f(sp["launched_ms"]), _f(sp["cuda_graph_ms"]),
                         _f(sf["launched_ms"]), _f(sf["cuda_graph_ms"]),
                         "folded" if sf["recompute_ratio"] is not None else "plain",
                         f"{sf['cuda_graph_ms'] / sp['cuda_graph_ms']:.2f}x"])
    checks = [f"{SHAPES[r['model']]} {r['rel_err_static_vs_dynamic']:g}" for r in _rows(data, part="shape_check")]
    return (_table(["shape", "N", "Spiffy, Inductor: launched", "replayed", "SpecFold: launched",
                    "replayed", "SpecFold's replay", "SpecFold / Spiffy, replayed"], rows)
            + ["", "Static cache against dynamic cache, relative difference of the logits (eager, bf16): "
               + ", ".join(checks) + ".", ""])
