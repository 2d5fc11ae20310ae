"""``bench.report``'s decode-loop tables: one step's verification call, whole decodes (the trace-driven
rows at real shapes, the shipped model's rows) and README's headline."""

from __future__ import annotations

from bench.plot import draft_budget
from bench.tables import E2E_MODES, SHAPES, Section
from bench.tables import first_matching as _one, fmt as _f, markdown_table as _table, matching as _rows

_YES = {True: "yes", False: "NO", None: "-"}
MODE_NAMES = {**E2E_MODES, "specfold_heads": "SpecFold, per-layer heads"}  # the tables' rows, on-request modes too
BOUNDARIES = {False: "separate", True: "fused", "writes": "fused writes"}  # generate(fuse_boundaries=...) of a row


def mode_name(row: dict) -> str:
    """A row's mode in words; ``specfold_heads`` with one head for all layers (``--dense-fraction``) says its
    fraction."""
    fraction = row.get("dense_fraction")
    if row["mode"] == "specfold_heads" and isinstance(fraction, (int, float)):
        return f"SpecFold, head {fraction:g} of the rows"
    return MODE_NAMES[row["mode"]]


def _spiffy_compiled_twin(data: dict, row: dict) -> dict | None:
    """The row of Spiffy under Inductor that ``row`` is compared with: same shape, task, record kind, block
    boundaries and repeat (``repeat``: one of several runs of the same point)."""
    return _one(data, model=row["model"], task=row["task"], mode="spiffy_compiled", trace_driven=row["trace_driven"],
                fuse_boundaries=row.get("fuse_boundaries"), repeat=row.get("repeat"))


def _boundaries(row: dict) -> str:
    """A row's block boundaries in words, and its repeat where the run has several."""
    label = BOUNDARIES[row.get("fuse_boundaries") or False]
    return label + (f", run {row['repeat']}" if row.get("repeat") is not None else "")


def _e2e_ratio(data: dict, row: dict) -> str:
    base = _spiffy_compiled_twin(data, row)
    return f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else ""


def _step_ms(row: dict) -> float:
    """A row's verification step: from the plain passes where the row has them, else the instrumented ones."""
    return row["plain_step_ms"] if row.get("plain_step_ms") is not None else row["step_ms"]


def _step_ratio(data: dict, row: dict) -> str:
    """Spiffy under Inductor's step over the row's, where both made the same number of steps (the speculative
    modes of one record: the same calls). A whole decode's ratio lies between 1 and this one, since the
    prefill and block writes cost every mode of a record the same."""
    base = _spiffy_compiled_twin(data, row)
    if not base or base.get("steps") is None or base.get("steps") != row.get("steps"):
        return ""
    return f"{_step_ms(base) / _step_ms(row):.2f}x"


def _against_launched_prefill(data: dict, row: dict) -> str:
    """A shipped-model row's tokens/s over its compiled model's in the Python loop with the prefill launched
    (the mode's root, e.g. ``specfold`` for ``specfold_device_fused``, then ``_launched_prefill``)."""
    root = row["mode"]
    for suffix in ("_launched_prefill", "_fused", "_device"):
        root = root.removesuffix(suffix)
    base = _one(data, task=row["task"], mode=f"{root}_launched_prefill", trace_driven=False)
    return f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else ""


def host_share(row: dict) -> float:
    """The host's share of a step: from the plain passes where the row has them (``plain_host_ms``), else
    from the instrumented ones."""
    if row.get("plain_host_ms") is not None:
        return row["plain_host_ms"] / row["plain_step_ms"]
    return row["host_ms"] / row["step_ms"]


def render_e2e_headline(data: dict) -> list[str]:
    """README's table: trace-driven tokens/s per shape, task and block-boundary handling (separate or all
    fused; the writes-only rows are on the benchmark page), each mode, SpecFold against Spiffy under
    Inductor in the same loop: a row where both were run, "-" for another mode that was not. A mode that
    no row has is left out, and so is the boundaries column where every row has the same."""
    rows = []
    for model in SHAPES:
        for fused in (f for f in BOUNDARIES if f != "writes"):
            for task in dict.fromkeys(r["task"] for r in _rows(data, model=model, trace_driven=True)):
                by_mode = {m: _one(data, model=model, task=task, mode=m, trace_driven=True, fuse_boundaries=fused)
                           for m in E2E_MODES}
                if by_mode["specfold"] and by_mode["spiffy_compiled"]:
                    rows.append((SHAPES[model], task, BOUNDARIES[fused], by_mode))
    modes = [m for m in E2E_MODES if any(by_mode[m] for *_, by_mode in rows)]
    boundaries = len({b for _, _, b, _ in rows}) > 1
    lines = [[shape, task] + ([b] if boundaries else [])
             + [f"{by_mode[m]['tokens_per_s']:.0f}" if by_mode[m] else "-" for m in modes]
             + [_e2e_ratio(data, by_mode["specfold"]), f"{100 * host_share(by_mode['specfold']):.0f}%"]
             for shape, task, b, by_mode in rows]
    return _table(["shape", "task"] + (["block boundaries"] if boundaries else [])
                  + [f"{E2E_MODES[m]} (tokens/s)" for m in modes]
                  + ["SpecFold / Spiffy, Inductor", "host share of a SpecFold step"], lines)


def render_end_to_end(data: dict) -> list[str]:
    lines = []
    traced = [r for r in data["rows"] if r["trace_driven"]]
    if traced:
        lines += ["Trace-driven at the real shapes (random bf16 weights; every call, seed, fold mask and accepted "
                  "draft forced from the shipped model's record; trace reproduced: the replay made exactly the "
                  "recorded calls and tokens):", ""]
        lines += _table(["shape", "task", "block boundaries", "mode", "tokens/s", "NFE", "step (ms)", "host (ms)",
                         "host, plain passes (ms)", "prefill (ms)", "TTFT (ms)", "/ Spiffy, Inductor",
                         "/ Spiffy, Inductor, a step", "trace reproduced"],
                        [[SHAPES.get(r["model"], r["model"]), r["task"], _boundaries(r),
                          mode_name(r),
                          f"{r['tokens_per_s']:.0f}", _f(r["nfe"]), _f(r["step_ms"]), _f(r["host_ms"]),
                          _f(r.get("plain_host_ms")), _f(r.get("prefill_ms")), _f(r["ttft_ms"], 1), _e2e_ratio(data, r),
                          _step_ratio(data, r), "yes" if r["trace_reproduced"] else "NO"]
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


def render_draft_budget(data: dict) -> list[str]:
    """Whole decodes at several draft budgets: per shape, task and budget the two compared modes' tokens/s,
    then each mode at its fastest budget against the other at its own."""
    rows, best_rows = [], []
    for model in SHAPES:
        for task in dict.fromkeys(r["task"] for r in _rows(data, model=model)):
            for budget in sorted({draft_budget(r) for r in _rows(data, model=model, task=task)}):
                at = {m: next((r for r in _rows(data, model=model, task=task, mode=m) if draft_budget(r) == budget),
                              None) for m in ("spiffy_compiled", "specfold")}
                if not all(at.values()):
                    continue
                sp, sf = at["spiffy_compiled"]["tokens_per_s"], at["specfold"]["tokens_per_s"]
                rows.append([SHAPES[model], task, str(budget), _f(at["specfold"]["nfe"]), f"{sp:.0f}", f"{sf:.0f}",
                             f"{sf / sp:.2f}x"])
            best = {m: max(found, key=lambda r: r["tokens_per_s"]) for m in ("spiffy_compiled", "specfold")
                    if (found := _rows(data, model=model, task=task, mode=m))}  # each mode's fastest budget
            if len(best) == 2:
                sp, sf = best["spiffy_compiled"], best["specfold"]
                best_rows.append([SHAPES[model], task, f"{sp['tokens_per_s']:.0f} ({draft_budget(sp)})",
                                  f"{sf['tokens_per_s']:.0f} ({draft_budget(sf)})",
                                  f"{sf['tokens_per_s'] / sp['tokens_per_s']:.2f}x"])
    return (_table(["shape", "task", "draft budget", "NFE", "Spiffy, Inductor (tokens/s)", "SpecFold (tokens/s)",
                    "SpecFold / Spiffy"], rows)
            + ["", "Each mode at its fastest draft budget (in brackets):", ""]
            + _table(["shape", "task", "Spiffy, Inductor (tokens/s)", "SpecFold (tokens/s)", "SpecFold / Spiffy"],
                     best_rows) + [""])


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


def render_logit_width(data: dict) -> list[str]:
    """The device loop's logits at the main state's masked positions (the default) against every
    position's (``all_logits``), per shape, task and mode: tokens/s and a step's wall time each."""
    rows, masked = [], {"rows": _rows(data, all_logits=False)}
    for model in SHAPES:
        for r in _rows(data, model=model, all_logits=False):
            every = _one(data, model=model, task=r["task"], mode=r["mode"], all_logits=True)
            rows.append([SHAPES[model], r["task"], mode_name(r), f"{r['tokens_per_s']:.0f}",
                         _f(r["plain_step_ms"]), f"{every['tokens_per_s']:.0f}" if every else "-",
                         _f(every["plain_step_ms"]) if every else "-",
                         f"{r['tokens_per_s'] / every['tokens_per_s']:.3f}x" if every else "-",
                         _e2e_ratio(masked, r)])
    return _table(["shape", "task", "mode", "masked positions: tokens/s", "step (ms)", "every position: tokens/s",
                   "step (ms)", "masked / every", "/ Spiffy, Inductor (masked)"], rows) + [""]


# docs/benchmarks.md's whole-decode sections, in the page's order (bench.report.SECTIONS takes them in)
E2E_SECTIONS = [
    Section("Whole decodes, end to end", "h200/end_to_end.json",
            "python -m bench.trace_driven record --device cpu --limit 4 --grid --out TRACE.pt, then python -m "
            "bench.trace_driven replay --trace TRACE.pt --device cuda --models MODEL --repeats 3 --modes "
            "vanilla,spiffy,spiffy_compiled,specfold (one process a shape on one machine); the shipped model's "
            "rows: python -m bench.end_to_end --device cuda --limit 8 "
            "--repeats 2; merged with python -m bench.plot bench/results/h200/end_to_end.json RUN.json ...",
            "Every forward, block write, copy and host step of a decode, CUDA graphs on, the device loop "
            "(`generate(..., loop=\"device\")`); up to 96 new tokens, draft budget 16, tau 0.1. Trace-driven: "
            "the `--grid` record (prompts left-padded to whole blocks, so that both families lay them out "
            "alike), 4 test problems a task, each timed 3 times (median) after a warm-up pass, the defaults a "
            "user gets (block boundaries separate, eager prefill and writes, each step's logits at the masked "
            "positions); the shipped model: 8 a task, 2 times, in a run of its own. Per task: tokens/s = all its "
            "problems' tokens over their wall time (prefill included), NFE and TTFT (until the first block is "
            "committed) their means, step (a verification step's wall time) and host (the part of it not "
            "covered by device work) means over all steps. Spiffy under Inductor and SpecFold ran again at 1.5B "
            "and NLD-3B on that machine, in other processes (the per-layer heads section below): SpecFold "
            "against Spiffy came out within 0.05 of these (1.5B 1.22x / 1.14x / 1.26x, NLD-3B 1.31x / 1.17x / "
            "1.41x).",
            render_end_to_end),
    Section("Block boundaries separate and fused (H200)", "h200/fused_boundaries.json",
            "python -m bench.trace_driven record --device cpu --limit 4 [--grid | --fuse-boundaries [writes]] --out "
            "TRACE.pt, then python -m bench.trace_driven replay --trace TRACE.pt --device cuda --models MODEL "
            "--repeats 3 (one run per shape and record; NLD-3B replays the --grid record); merged with python -m "
            "bench.plot bench/results/h200/fused_boundaries.json RUN.json ...",
            "The trace-driven decodes of the section above, all four modes (Spiffy eager too), in runs of their "
            "own on the same kind of machine: 1.5B and 7B from a record with block boundaries separate and from "
            "records with them fused (`fuse_boundaries=True`) or the block writes alone fused (`\"writes\"`), "
            "NLD-3B separate only (NLD predicts no next-block token before a write, so it never fuses). Compare "
            "rows within this section only: its separate rows run slower than the section above's (SpecFold at "
            "1.5B math 1147 against 1519 tokens/s), so the two sections' runs differ in more than the "
            "boundaries. These rows ran with the prompt's prefill launched and copied into the static cache, "
            "not replayed from a CUDA graph as by default (TTFT at 1.5B math 22.1-24.6 ms, against 11.0-12.3 "
            "ms in the H100 sections below): the fused prefill, a launched pass, is what lost on math here.",
            render_end_to_end),
    Section("Block boundaries separate and fused (H100)", "h100/fused_boundaries.json",
            "python -m bench.trace_driven record --device cpu --limit 4 [--fuse-boundaries] --out TRACE.pt, then "
            "python -m bench.trace_driven replay --trace TRACE.pt --device cuda --models MODEL --repeats 3 --modes "
            "spiffy_compiled,specfold (one process a shape and record, all on one machine); merged with python -m "
            "bench.plot bench/results/h100/fused_boundaries.json RUN.json ...",
            "The two compared modes from records of the Fast-dLLM v2 prompt layout (no `--grid`: a prompt's tail "
            "shares the first decoded block, so the prefill verifies it and most answers cross a block "
            "boundary), block boundaries separate and fused. Fused, a problem takes one forward fewer on math "
            "(2.5 against 3.5), and decodes run faster in both modes: at 1.5B Spiffy under Inductor 1.17x / "
            "1.12x / 1.01x and SpecFold 1.17x / 1.14x / 1.02x (math / code / instruct), at 7B 1.19x / 1.14x / "
            "1.01x and 1.20x / 1.15x / 1.02x; the math prefill that verifies the first block costs 0.17-0.21 ms "
            "more at 1.5B (4.71 ms) and 0.55-0.61 ms more at 7B (9.18-9.21 ms). This is not the H200 section's "
            "outcome, where fusing lost on math with the prefill launched (the next section repeats it on other "
            "H100s; the default stays separate, docs/design-notes.md says why). The `--grid` record of the "
            "headline has nothing to fuse: its prompts fill whole blocks (the first state's seed comes from the "
            "prefill) and its answers fit in one block.",
            render_end_to_end),
    Section("Block boundaries separate and fused, repeated (H100)", "h100/fused_boundaries_repeat.json",
            "bash bench/gpu_session.sh boundaries (records made on the CPU with python -m bench.trace_driven record "
            "--device cpu --limit 4 [--fuse-boundaries]; per shape four replays in the order separate, fused, "
            "separate, fused, one process each, on one machine); merged with python -m bench.plot "
            "bench/results/h100/fused_boundaries_repeat.json RUN.json ... (each run's rows tagged with its repeat, "
            "replay --tag-repeat K)",
            "The section above's comparison on other H100 machines (one a shape), each record replayed twice, "
            "alternating, so that a drift of the machine would show as a difference between the two runs of one "
            "record. Fused against separate, run 1 and run 2 (math / code / instruct): at 1.5B Spiffy under "
            "Inductor 1.18x and 1.17x / 1.13x and 1.13x / 1.01x and 1.01x, SpecFold 1.14x and 1.11x / 1.10x and "
            "1.07x / 1.00x and 0.99x; at 7B Spiffy under Inductor 1.19x and 1.17x / 1.15x and 1.14x / 1.02x and "
            "1.02x, SpecFold 1.20x and 1.23x / 1.15x and 1.16x / 1.03x and 1.01x. Fusing pays both modes again. "
            "At 1.5B it pays Spiffy more than SpecFold, so SpecFold's ratio to Spiffy under Inductor is lower "
            "with fused boundaries (math 1.08x and 1.04x, against 1.12x and 1.10x separate); at 7B about the "
            "same (math 1.19x and 1.22x, against 1.17x and 1.17x). The math prefill that verifies the first "
            "block costs 0.16-0.29 ms more at 1.5B (4.75-4.80 ms) and 0.44-0.59 ms more at 7B (9.17-9.25 ms).",
            render_end_to_end),
    Section("Prefill and block writes compiled (H200)", "h200/compile_writes.json",
            "python -m bench.trace_driven replay --trace TRACE.pt --device cuda --models MODEL --repeats 3 --modes "
            "spiffy_compiled,specfold --compile-writes (the --grid record of the first section, one process a "
            "shape on the same machine); merged with python -m bench.plot bench/results/h200/compile_writes.json "
            "RUN.json ...",
            "The first section's two compared modes with the prompt's prefill and the block writes compiled by "
            "Inductor as well (`generate(..., compile_writes=True)`, gpt-fast's `compile_prefill`), columns as "
            "there. The prefill takes 2.2-2.3 ms at 1.5B, 5.1-5.4 at 7B and 3.1-3.4 at NLD-3B (4.2-4.3, 7.4-8.0 "
            "and 5.3-5.5 ms eager). SpecFold against Spiffy under Inductor: 1.13x / 1.12x / 1.25x at 1.5B, "
            "1.63x / 1.38x / 1.72x at 7B, 1.37x / 1.22x / 1.42x at NLD-3B (math / code / instruct). The prefill "
            "and writes are the same work in both modes, so compiling them raises the ratio where they were a "
            "large share of a decode (7B and NLD-3B math), and within the runs' spread elsewhere (at 1.5B the "
            "first section's repeat differed by up to 0.05). The warm-up grows by the compiles: 96-116 s for "
            "Spiffy under Inductor, which compiles the prefill and writes first, against 29-30 s with eager ones.",
            render_end_to_end),
    Section("Per-layer cuBLAS heads (H200)", "h200/heads.json",
            "python -m bench.trace_driven record --device cpu --limit 4 --grid --split train --out TRAIN.pt, then "
            "python -m bench.trace_driven replay --trace TRACE.pt --device cuda --models MODEL --repeats 3 --modes "
            "spiffy_compiled,specfold,specfold_heads --heads-from TRAIN.pt (one process a shape on the machine of "
            "the first section)",
            "SpecFold with each layer's packed linears given their own cuBLAS head (`Tuning`'s `dense_fraction` "
            "as a profile over the depth, each gate's computed share at quantile 0.9 of a train-split record's "
            "fold masks) against the single default head, the first section's `--grid` record and columns. On "
            "the H200 the profile does not pay either: 0.98-1.00x of SpecFold's tokens/s at 1.5B and NLD-3B. "
            "The default stays one number.", render_end_to_end),
    Section("Draft budgets (H100)", "h100/draft_budget.json",
            "python -m bench.trace_driven record --device cpu --limit 4 --grid --draft-budget B --out TRACE_B.pt, then "
            "python -m bench.trace_driven replay --trace TRACE_B.pt --device cuda --models MODEL --repeats 3 --modes "
            "spiffy_compiled,specfold (one process a record, every record on one machine; bash bench/gpu_session.sh "
            "budgets); merged with python -m bench.plot bench/results/h100/draft_budget.json RUN.json ...",
            "The two compared modes of the first section at draft budgets 4 to 16 (16 is the default and the "
            "headline's), each budget from a `--grid` record of its own (the shipped model decoding with that "
            "budget: its acceptance, its fold masks). Fewer drafts make each call cheaper and accept less, and "
            "the two modes trade these differently: Spiffy under Inductor pays for every draft row, so it "
            "decodes fastest at budget 4 on every task; SpecFold pays for the computed rows, so it is fastest at "
            "16 on math and code at 1.5B and 7B, and at 4 on the rest (NLD-3B's every task). At budget 4 (N = 5) "
            "the cost model runs SpecFold's plain graph, which is Spiffy's: the two modes' rows there differ by "
            "1-2%, the spread of the same work in two passes. Each "
            "mode at its own fastest budget, SpecFold decodes 1.02x / 1.03x / 1.01x as fast as Spiffy under "
            "Inductor at 1.5B, 1.06x / 1.06x / 1.01x at 7B and 1.00x / 1.01x / 1.01x at NLD-3B (math / code / "
            "instruct), against 1.20x / 1.16x / 1.21x, 1.37x / 1.20x / 1.48x and 1.20x / 1.10x / 1.26x at the "
            "shared default of 16 in these runs.",
            render_draft_budget),
    Section("Whole decodes with the prefill replayed (H100)", "h100/end_to_end.json",
            "python -m bench.end_to_end --device cuda --limit 6 --repeats 3 --modes vanilla,"
            "spiffy_compiled_launched_prefill,specfold_launched_prefill,spiffy_compiled,specfold,"
            "spiffy_compiled_device,specfold_device,spiffy_compiled_device_fused,specfold_device_fused; python -m "
            "bench.trace_driven record --device cpu --limit 4 --fuse-boundaries --out TRACE.pt, then python -m "
            "bench.trace_driven replay --trace TRACE.pt --device cuda --models MODEL --repeats 3 (fast-dllm-v2-1.5b, "
            "fast-dllm-v2-7b); merged with python -m bench.plot bench/results/h100/end_to_end.json RUN.json ...",
            "As above, with the prompt's prefill replayed from a CUDA graph straight into the static cache "
            "(`VerifyGraphs.prefill`, the default); `*_launched_prefill` modes launch it and copy it in, as "
            "`generate(cuda_graphs=True)` did before. tokens/s here is the rate of `generate` called on every "
            "problem in turn with nothing timed inside (the lower median of 3 passes); the other columns come "
            "from instrumented passes (prefill: the prefill's wall time with its GPU work). The shipped model: 6 "
            "test problems a task, every mode in one process; the trace-driven rows: the fused record (block "
            "boundaries speculated), 4 problems a task. On the shipped model a step is a few hundred microseconds, "
            "so the same point measured in two processes has differed by up to a third: compare rows of one "
            "process. The replayed prefill runs the model's eager layers: at 1.5B a math prompt's, one block plus "
            "the verified first block, takes 4.8 ms (2.7 ms compiled, next section).", render_end_to_end),
    Section("The shipped model, a second run (H100)", "h100/end_to_end_shipped_repeat.json",
            "bash bench/gpu_session.sh shipped --modes vanilla,vanilla_device,spiffy,spiffy_device,"
            "spiffy_compiled_launched_prefill,specfold_launched_prefill,spiffy_compiled,specfold,"
            "spiffy_compiled_device,specfold_device,spiffy_compiled_device_fused,specfold_device_fused",
            "The section above's shipped-model rows measured again in another machine session, with the eager "
            "modes added. The device loop against the Python loop with its prefill launched: SpecFold 2.14x / "
            "1.20x / 1.21x (math / code / instruct), Spiffy under Inductor 2.17x / 1.21x / 1.22x, against 2.61x / "
            "1.29x / 1.50x and 2.63x / 1.30x / 1.49x above; the launched-prefill rows ran faster here (instruct "
            "2362 against 1863 tokens/s), the device loop's about as fast (2865 against 2802).",
            render_end_to_end),
    Section("Prefill and block writes compiled (H100)", "h100/compile_writes.json",
            "python -m bench.trace_driven record --device cpu --limit 4 --fuse-boundaries --out TRACE.pt, then "
            "python -m bench.trace_driven replay --trace TRACE.pt --device cuda --models fast-dllm-v2-1.5b "
            "--repeats 3 --compile-writes",
            "The trace-driven 1.5B decodes of the section above with every mode's prompt prefill and block "
            "writes compiled by Inductor (`generate(..., compile_writes=True)`), every position's logits in each "
            "step (as `--all-logits`), one process, columns as above. "
            "The math prompt's prefill takes 2.7 ms instead of 4.8 ms, and whole decodes gain in every mode; "
            "SpecFold against Spiffy under Inductor is 1.13x / 1.09x / 1.20x (math / code / instruct) here, "
            "1.08x / 1.07x / 1.19x with the eager writes above (another process). The compiles lengthen the "
            "warm-up: 178 s for the first mode, which compiles the prefill and writes the others reuse, against 7 s "
            "with eager writes. The instrumented passes ran 0.1-5.2% slower than the plain ones here (SpecFold's "
            "0.1-2.5%); in other processes of this configuration SpecFold's ran up to 12% slower, so the host "
            "share is taken from the plain passes: 4.9% / 6.1% / 2.6% of a SpecFold step (Spiffy under Inductor: "
            "4.3% / 4.4% / 1.9%). "
            "`compile_writes` stays off by default: like gpt-fast's `compile_prefill`, it trades minutes of "
            "compilation for faster decodes.", render_end_to_end),
    Section("Per-layer cuBLAS heads (H100)", "h100/heads.json",
            "python -m bench.trace_driven record --device cpu --limit 4 --fuse-boundaries [--split train] --out "
            "TRACE.pt (TRAIN.pt), then python -m bench.trace_driven replay --trace TRACE.pt --device cuda --models "
            "fast-dllm-v2-7b --repeats 3 --modes spiffy_compiled,specfold,specfold_heads --heads-from TRAIN.pt",
            "The trace-driven 7B decodes (test-split record, eager prefill and writes, every position's logits "
            "in each step), one process, columns as "
            "above. `specfold_heads` gives each layer's packed linears their own cuBLAS head (`Tuning`'s "
            "`dense_fraction` as a profile over the depth), measured on a record of train-split prompts "
            "(`ops.fold_masks.dense_fractions`, quantile 0.9: 0.17 / 0.18 / 0.27 / 0.40 / 0.43 / 0.56 over the six "
            "recorded gates), so a 17-branch call's 544 rows have heads of 128 rows in layers 0-9, 192 in 10-13, "
            "256 in 14-23 and 320 in 24-27, against 256 in every layer at the default 0.45. On the H100 the "
            "profile changes nothing measurable: steps take 5.37 / 5.54 / 8.47 ms against 5.29 / 5.57 / 8.68 ms "
            "(math / code / instruct, instrumented), whole decodes 0.98x / 0.95x / 0.99x. By the roofline (about "
            "3.35 TB/s and 990 TFLOP/s of dense bf16) 128 to 256 rows of the 7B weights sit near the H100's "
            "ridge, where fewer rows save little; on the H200 (4.8 TB/s) a 7B layer's position-wise work takes "
            "247 us at 128 rows against 316 at 256 (the packed-rows section), so the profile may pay there: not "
            "measured. The default stays one number. SpecFold against Spiffy under Inductor at 7B in this run "
            "(every position's logits in each step): 1.25x / 1.21x / 1.50x.", render_end_to_end),
    Section("One smaller cuBLAS head (H100)", "h100/dense_fraction.json",
            "python -m bench.trace_driven replay --trace TRACE.pt --device cuda --models fast-dllm-v2-1.5b --repeats 3 "
            "--modes vanilla,spiffy,spiffy_compiled,specfold,specfold_heads --dense-fraction 0.2 (the --grid record "
            "of the first H200 section)",
            "SpecFold with `dense_fraction=0.2` in every layer (a 128-row cuBLAS head for a 17-branch call's 544 "
            "rows, against 256 at the default 0.45), the other modes in the same process, columns as above. The "
            "smaller head makes whole decodes slower: 0.88x / 0.98x / 0.85x of SpecFold's tokens/s (math / code / "
            "instruct), steps of 4.12 / 3.32 / 4.46 ms against 3.49 / 3.20 / 3.72 ms. In the record's folded calls "
            "the computed rows grow with depth (at the six recorded gates, math: 77, 93, 110, 137, 148 and 168 "
            "of 544 on average), so the deeper layers outgrow 128 rows and spill: 2 of the 12 math calls and 4 of "
            "the 33 instruct calls fit the small head at every gate, all but 5 instruct calls fit the default one. "
            "SpecFold against Spiffy under Inductor in this run: 1.16x / 1.09x / 1.19x.", render_end_to_end),
    Section("Logits of the masked positions in the device loop (H100)", "h100/logit_width.json",
            "python -m bench.trace_driven record --device cpu --limit 4 --fuse-boundaries --out TRACE.pt, then "
            "python -m bench.trace_driven replay --trace TRACE.pt --device cuda --models MODEL --repeats 3 --modes "
            "spiffy_compiled,specfold [--compile-writes] [--all-logits]",
            "The trace-driven decodes with each step's logits at the main state's masked positions and position 0, "
            "padded to a power of two (the device loop's default, `device_loop.logit_width`), against every "
            "position's (`generate(..., all_logits=True)`). 1.5B: "
            "prefill and writes compiled, the two variants back to back in one machine (the second process "
            "reusing the first's compiled prefill and writes); 7B: eager prefill and writes, masked positions "
            "only (another process on the same machine). Columns: tokens/s of the plain passes and a step's "
            "wall time from them. At 1.5B the narrower logits make instruct decodes 5.1% (SpecFold) and 3.8% "
            "(Spiffy under Inductor) faster and code decodes 1.4% / 1.0%; math decodes, 2-3 steps a problem, "
            "do not move. SpecFold gains more than Spiffy because the LM head, which folding cannot skip, is a "
            "larger share of its shorter step.", render_logit_width),
    Section("All three shapes on one record (H100)", "h100/trace_grid.json",
            "python -m bench.trace_driven record --device cpu --limit 4 --grid --out TRACE.pt, then python -m "
            "bench.trace_driven replay --trace TRACE.pt --device cuda --models MODEL --repeats 3 (one process a "
            "shape on one machine; fast-dllm-v2-7b with --modes vanilla,spiffy_compiled,specfold); merged with "
            "python -m bench.plot bench/results/h100/trace_grid.json RUN.json ...",
            "The trace-driven decodes of the three shapes from one record, the `--grid` one (prompts left-padded "
            "to whole blocks, so that both families lay them out alike), with the defaults a user gets: block "
            "boundaries separate, eager prefill and writes, each step's logits at the masked positions. Columns "
            "as in the first section. SpecFold against Spiffy under Inductor: 1.11x / 1.05x / 1.16x at 1.5B, "
            "1.38x / 1.20x / 1.49x at 7B, 1.26x / 1.18x / 1.29x at NLD-3B (math / code / instruct); against "
            "vanilla 1.21-1.86x. SpecFold's steps take 0.85-0.91x of Spiffy's at 1.5B, 0.65-0.77x at 7B and "
            "0.75-0.79x at NLD-3B (plain passes); the rest of a decode, its prefill (4.6, 8.8 and 6.0 ms) and "
            "the host's reads, is the same in both modes, and a code answer takes 2 steps after it. A 7B or "
            "NLD-3B SpecFold step costs about what vanilla's one-branch step (the eager model) costs (7B: 8.5 "
            "against 8.3 ms on math; NLD-3B: 5.6 against 5.5 ms), so its drafts come nearly free there. The "
            "host's share of a SpecFold step (plain passes): 3.5-7.2% at 1.5B, at most 2.8% at the larger shapes. The same "
            "replays on another H100 machine (`bench/results/h100/trace_grid_repeat.json`: Spiffy eager left "
            "out, and vanilla at NLD-3B) put SpecFold against Spiffy under Inductor within 0.05 of these: "
            "1.16x / 1.06x / 1.19x, 1.40x / 1.18x / 1.51x, 1.23x / 1.13x / 1.30x.",
            render_end_to_end),
    Section("Steps launched ahead", "h100/steps_per_read.json",
            "python -m bench.end_to_end --device cuda --limit 6 --repeats 2 --tasks math,instruct --modes "
            "spiffy_compiled,specfold,spiffy_compiled_device,spiffy_compiled_device_read4,specfold_device,"
            "specfold_device_read2,specfold_device_read4",
            "`generate(..., loop=\"device\", steps_per_read=K)` (modes `*_readK`) launches K steps before the "
            "host reads their outcomes; a step launched after its block's last one changes nothing but runs its "
            "forward. The shipped model, CUDA graphs on, 6 test problems a task, 2 timed passes (median), draft "
            "budget 16, tau 0.1, columns as above. Reading once every 2 or 4 steps leaves the host's time a step "
            "where it was, so the read after each step costs little, and the forwards launched past a block's "
            "end cost tokens/s: keep the default of 1. The host time left is highest on math, the task with the "
            "fewest steps a decode, so it is spent once a decode or a block rather than once a step.",
            render_end_to_end),
]
