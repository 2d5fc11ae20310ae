"""Render docs/benchmarks.md from the committed result files.

    python -m bench.report > docs/benchmarks.md
    python -m bench.report --readme-table      # README.md's per-call table
    python -m bench.report --readme-e2e        # README.md's headline (whole decodes)
    python -m bench.report --readme-batched    # README.md's serving table (requests served at once)

Every table is computed from one JSON under ``bench/results/`` and printed with the command that
produced that file and the hardware and versions the file records; nothing here is typed in by hand.
``tests/docs/test_benchmarks_doc.py`` checks that the committed page equals this output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.report_batched import render_batched, render_batched_headline, render_packed_rows
from bench.report_e2e import E2E_SECTIONS, render_decode_loop, render_e2e_headline
from bench.tables import SHAPES, Section
from bench.tables import first_matching as _one, fmt as _f, markdown_table as _table, matching as _rows

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

MODES = {"dense": "dense eager", "dense_compiled": "dense Inductor", "specfold": "SpecFold",
         "spiffy_compiled": "Spiffy, Inductor"}
# bench.run's kernel groups (breakdown suite), in words
PARTS = {"dense_gemm": "cuBLAS GEMMs", "rest(elementwise,norms)": "the rest (norms, RoPE, elementwise)",
         "attention_prefix": "prefix attention", "attention_block_merge": "block attention + merge",
         "gate": "gate (fold flags)", "origin+compaction": "origin resolution + compaction",
         "packed_linear_spill": "spill launches of packed linears", "packed_swiglu": "packed SwiGLU",
         "packing_gather_scatter": "Inductor's gathers and scatters around the fold ops"}
# per_check's drafts are built to reach these recompute ratios; the measured ratio of each is printed
TARGET_RATIOS = (0.1, 0.25, 0.35, 0.5, 0.6)
HEADLINE_RATIO = 0.25


def _versions(data: dict) -> str:
    """The hardware and versions a result file records (every run's, when it merges several)."""
    seen = []
    for v in [data.get("versions")] + [r.get("versions") for r in data.get("runs", [])]:
        if v and v not in seen:
            seen.append(v)
    parts = []
    for v in seen:
        where = v.get("gpu", data.get("machine", "CPU"))
        if "driver" in v:
            where += f" (driver {v['driver']})"
        soft = ", ".join(f"{k} {v[k]}" for k in ("python", "torch", "triton") if k in v)
        parts.append(f"{where}; {soft}")
    return "; ".join(parts)


# ---- per suite -------------------------------------------------------------------------------------

def render_per_check(data: dict) -> list[str]:
    out = []
    for model in SHAPES:
        for prefix in sorted({r["prefix"] for r in _rows(data, model=model)}):
            sel = dict(model=model, prefix=prefix)
            ns = sorted({r["n_branches"] for r in _rows(data, mode="specfold", **sel)})
            ratios = {t: _one(data, mode="specfold", target_ratio=t, n_branches=17, **sel) for t in TARGET_RATIOS}
            header = ["N", "dense eager", "dense Inductor"]
            header += [f"SpecFold r={r['recompute_ratio']:.2f}" if r else f"SpecFold target {t}"
                       for t, r in ratios.items()]
            header += ["headline / eager", "headline / Inductor", "floor", "headline / floor"]
            rows = []
            for n in ns:
                eager = _one(data, mode="dense", n_branches=n, **sel)
                ind = _one(data, mode="dense_compiled", n_branches=n, **sel)
                cells, head = [], None
                for t in TARGET_RATIOS:
                    r = _one(data, mode="specfold", target_ratio=t, n_branches=n, **sel)
                    if n == 1:  # nothing to fold: one plain-graph point, in the first column
                        r = _one(data, mode="specfold", n_branches=1, **sel) if t == TARGET_RATIOS[0] else None
                    plain = r is not None and (r.get("folded") is False or n == 1)
                    cells.append("" if r is None else _f(r["ms"]) + (" (plain)" if plain else ""))
                    if t == HEADLINE_RATIO or (n == 1 and r is not None):
                        head = r
                floor = _one(data, mode="floor", target_ratio=HEADLINE_RATIO, n_branches=n, **sel)
                ratio = (lambda base: f"{head['ms'] / base['ms']:.2f}x" if head and base else "")
                rows.append([str(n), _f(eager and eager["ms"]), _f(ind and ind["ms"])] + cells
                            + [ratio(eager), ratio(ind), _f(floor and floor["ms"]), ratio(floor)])
            out += [f"**{SHAPES[model]}, prefix {prefix}** (ms per verification forward)", ""]
            out += _table(header, rows) + [""]
    writes = [(SHAPES[r["model"]], r["prefix"], r["mode"], r["ms"]) for r in data["rows"]
              if r["mode"] in ("write", "write_compiled")]
    if writes:
        out += ["Block writes (one block after the prefix, ms):", ""]
        keys = sorted({(m, p) for m, p, _, _ in writes}, key=lambda k: (list(SHAPES.values()).index(k[0]), k[1]))
        get = {(m, p, mode): ms for m, p, mode, ms in writes}
        out += _table(["shape", "prefix", "eager", "Inductor"],
                      [[m, str(p), _f(get.get((m, p, "write"))), _f(get.get((m, p, "write_compiled")))]
                       for m, p in keys]) + [""]
    return out


def render_headline(data: dict, prefix: int = 512, ns: tuple[int, ...] = (5, 17, 33)) -> list[str]:
    """The README's table: per_check at one prefix, SpecFold at the headline ratio."""
    rows = []
    for model, shape in SHAPES.items():
        for n in ns:
            sel = dict(model=model, prefix=prefix, n_branches=n)
            eager, ind = _one(data, mode="dense", **sel), _one(data, mode="dense_compiled", **sel)
            sf = _one(data, mode="specfold", target_ratio=HEADLINE_RATIO, **sel)
            if not (eager and ind and sf):
                continue
            rows.append([shape, str(n), _f(eager["ms"]), _f(ind["ms"]),
                         _f(sf["ms"]) + ("" if sf.get("folded", True) else " (plain graph)"),
                         f"{sf['recompute_ratio']:.2f}", f"{sf['ms'] / eager['ms']:.2f}x", f"{sf['ms'] / ind['ms']:.2f}x"])
    return _table(["shape", "N", "dense eager (ms)", "dense Inductor (ms)", "SpecFold (ms)", "recompute ratio",
                   "SpecFold / eager", "SpecFold / Inductor"], rows)


def render_check(data: dict) -> list[str]:
    cols = [("P1_vs_fp32", "P1: folded, tau = 0"), ("dense_bf16_vs_fp32", "dense bf16"),
            ("P2_main_vs_fp32", "P2: main row"), ("P4_vs_fp32_ref", "P4: folded vs fp32 reference, same masks"),
            ("bf16_ref_vs_fp32_ref", "bf16 reference vs fp32 reference"),
            ("cuda_graph_replay_vs_call", "CUDA-graph replay vs call")]
    rows = [[SHAPES.get(r["model"], r["model"])] + [f"{100 * r[k]:.2f}%" for k, _ in cols]
            + ["yes" if r.get("ok") else "no"] for r in data["rows"]]
    return _table(["shape"] + [c for _, c in cols] + ["ok"], rows) + [""]


def render_breakdown(data: dict) -> list[str]:
    cols = sorted({(r["model"], r["mode"]) for r in data["rows"]},
                  key=lambda c: (list(SHAPES).index(c[0]), c[1] != "specfold"))
    parts = []
    for r in data["rows"]:
        if r["part"] not in parts:
            parts.append(r["part"])
    get = {(r["model"], r["mode"], r["part"]): r["ms_per_forward"] for r in data["rows"]}
    rows = [[PARTS.get(p, p)] + [_f(get.get((m, mode, p))) or "-" for m, mode in cols] for p in parts]
    rows.append(["total"] + [_f(sum(v for (m2, mo2, _), v in get.items() if (m2, mo2) == c)) for c in cols])
    n, prefix = data["rows"][0]["n_branches"], data["rows"][0]["prefix"]
    header = ["part"] + [f"{SHAPES[m]} {MODES.get(mode, mode)}" for m, mode in cols]
    return [f"Kernel time in ms per forward, N = {n}, prefix {prefix}:", ""] + _table(header, rows) + [""]


def render_gate_calls(data: dict) -> list[str]:
    """One line a process, shape, N and target ratio: each variant's ms by repeat, dense under Inductor. A
    file of ``bench.gate_calls`` is one process (its rows carry no ``process``); merged files tag theirs."""
    keys = sorted({(r.get("process"), r["model"], r["n_branches"], r.get("target_ratio"))
                   for r in data["rows"] if r["mode"] == "specfold"}, key=lambda k: (k[0] or 1, k[2], k[3]))
    rows = []
    for process, model, n, target in keys:
        dense = _one(data, process=process, model=model, n_branches=n, mode="dense_compiled")
        for variant in dict.fromkeys(r["gate_variant"] for r in _rows(data, process=process, model=model)):
            runs = sorted(_rows(data, process=process, model=model, n_branches=n, target_ratio=target,
                                mode="specfold", gate_variant=variant), key=lambda r: r["repeat"])
            rows.append([str(process or 1), SHAPES[model], str(n), f"{target:g}", f"`{variant}`",
                         " / ".join(_f(r["ms"], 3) for r in runs), _f(dense and dense["ms"], 3)])
    lines = [f"How the file's runs were made: {data['procedure']}.", ""] if data.get("procedure") else []
    return lines + _table(["process", "shape", "N", "target ratio", "gate variant", "ms, each run",
                           "dense under Inductor (ms)"], rows) + [""]


def render_memory(data: dict) -> list[str]:
    rows = []
    for prefix in sorted({r["prefix"] for r in data["rows"]}):
        for n in sorted({r["n_branches"] for r in _rows(data, prefix=prefix)}):
            d = _one(data, prefix=prefix, n_branches=n, mode="dense")
            s = _one(data, prefix=prefix, n_branches=n, mode="specfold")
            copy = (d or s)["per_branch_cache_copy_bytes"]
            rows.append([str(prefix), str(n), _f(d and d["extra_bytes"] / 2**20, 1), _f(s and s["extra_bytes"] / 2**20, 1),
                         _f(copy / 2**30, 2), f"{100 * s['extra_bytes'] / copy:.1f}%" if s else ""])
    model = SHAPES.get(data["rows"][0]["model"], data["rows"][0]["model"])
    return ([f"{model}, peak memory beyond weights and cache:", ""]
            + _table(["prefix", "N", "dense (MiB)", "SpecFold (MiB)", "a per-branch cache copy (GiB)",
                      "SpecFold / copy"], rows) + [""])


def render_launch(data: dict) -> list[str]:
    rows = [[SHAPES[r["model"]], str(r["n_branches"]), MODES.get(r["mode"], r["mode"]), "yes" if r["folded"] else "no",
             _f(r["ms"]), _f(r["launched_ms"]), _f(r["host_ms"]), str(int(r["launches_per_call"]))]
            for r in data["rows"]]
    return _table(["shape", "N", "mode", "folded", "CUDA-graph replay (ms)", "launched (ms)",
                   "host time (ms)", "launches per call"], rows) + [""]


def render_eval(data: dict) -> list[str]:
    rows = []
    for task, modes in data["results"].items():
        for mode, r in modes.items():
            rows.append([task, mode, _f(r["accuracy"]), _f(r["nfe"]), f"{r['tokens_per_s']:.0f}",
                         _f(r["accepted_per_call"]) if mode != "vanilla" else "-",
                         _f(r["recompute_ratio"], 3) if r["recompute_ratio"] is not None else "-"])
    s = data["settings"]
    lines = [f"{s['limit']} test problems a task, tau = {s['tau']}, draft budget "
             f"{', '.join(map(str, s['draft_budgets']))}, kernels `{s['kernels']}` on the {s['device']}:", ""]
    lines += _table(["task", "mode", "accuracy", "NFE", "tokens/s", "accepted drafts per call",
                     "recompute ratio"], rows)
    equal = data.get("spiffy_tokens_equal_vanilla", {})
    lines += ["", "Spiffy's tokens equal vanilla's: " + ", ".join(f"{t} {'yes' if v else 'no'}" for t, v in equal.items())
              + ". SpecFold's sequences equal to vanilla's: "
              + ", ".join(f"{t} {100 * v['specfold']:.0f}%" for t, v in
                          data.get("specfold_sequences_equal_vanilla_share", {}).items()) + ".", ""]
    return lines


def render_sweep(data: dict) -> list[str]:
    tasks = data["settings"]["tasks"]
    rows = [[f"{r['tau']:g}"] + [_f(r[f"accuracy_{t}"]) for t in tasks]
            + [_f(r["nfe"]), f"{r['tokens_per_s']:.0f}", _f(r["recompute_ratio"], 3), _f(r["fold_argmax_agree"], 3),
               f"{r['fold_relerr_median']:.3f} / {r['fold_relerr_p99']:.3f}", _f(r["copy_argmax_agree"], 3),
               f"{r['copy_relerr_median']:.3f} / {r['copy_relerr_p99']:.3f}"] for r in data["rows"]]
    s = data["settings"]
    positions = data["rows"][0]["fidelity_positions"]
    return ([f"{s['limit']} test problems a task, draft budget {s['draft_budget']}; fidelity over {positions} "
             "still-masked draft positions against the dense verification logits, next to copying the "
             "parent branch's logits:", ""]
            + _table(["tau"] + [f"{t} accuracy" for t in tasks]
                     + ["NFE", "tokens/s", "recompute ratio", "folded: argmax agrees",
                        "folded: rel. error median / p99", "copy parent: argmax agrees",
                        "copy parent: median / p99"], rows) + [""])


SECTIONS = [
    Section("Correctness of the bf16 kernels against float32", "h200/check.json",
            "python -m bench.run --suite check",
            "Prefix 512, N = 9, every call folded, Triton kernels lowered through Inductor; relative "
            "difference of each bf16 result from an fp32 copy of the same model (random weights).",
            render_check),
    Section("Per-check latency", "h200/per_check.json",
            "python -m bench.run --suite per_check --models MODEL (one run per model; "
            "--suite writes for the block writes), runs merged with python -m bench.plot "
            "bench/results/h200/per_check.json RUN.json ...",
            "Median of 30 CUDA-graph replays of one verification forward, random bf16 weights of the real "
            "shapes, N and the prefix length marked dynamic. SpecFold: `backend=\"specfold\"` with default "
            "options, tau 0.3 on random drafts built to reach the target recompute ratios (the header gives "
            "the ratio measured at N = 17); \"(plain)\": the cost model runs the plain graph. Dense "
            "Inductor: `torch.compile(model.verify, dynamic=True)`. Floor: the weights read once or the "
            f"computed rows' FLOPs, whichever takes longer, at target {HEADLINE_RATIO}; the headline "
            f"column is SpecFold at target {HEADLINE_RATIO}.",
            render_per_check),
    Section("Where one forward's time goes", "h200/breakdown.json",
            "python -m bench.run --suite breakdown --breakdown-modes dense_compiled,specfold --ns 17 "
            "--models fast-dllm-v2-1.5b,fast-dllm-v2-7b",
            "torch.profiler kernel time, grouped by kernel name; r = 0.19.", render_breakdown),
    Section("The fold gate's launches in whole calls (H100)", "h100/gate_calls.json",
            "python -m bench.gate_calls --models MODEL --variants VARIANTS (see its docstring)",
            "Median of 30 CUDA-graph replays of one folded call, prefix 512, the logits of 60% of the positions, "
            "per_check's random drafts at target recompute ratios 0.1 and 0.25 (measured 0.06 and 0.19). The "
            "variants of a process ran alternating in that process; `default` is the shipped gate, "
            "`flags_4rows_1024` its flag launch with four rows a program in 1024-channel chunks and four warps, "
            "`resolve_global_memory` its resolve's pointer jumping through global memory. Kernel-level timings: "
            "`python -m bench.kernels.bench_gate` (`bench/kernels/results/bench_gate_h100.json`, with "
            "`--flag-sweep` `bench_gate_flag_sweep_h100.json`).", render_gate_calls),
    Section("Memory", "h200/memory.json", "python -m bench.run --suite memory",
            "Peak CUDA memory of one verification forward beyond the weights and the prefix cache.",
            render_memory),
    Section("Launched against replayed calls", "h200/launch.json",
            "python -m bench.run --suite launch --logit-fraction 0.6 --models fast-dllm-v2-1.5b",
            "Prefix 512, the logits of 60% of the positions (as the decode loop asks for the masked ones); "
            "launched: plain calls each waited for; host time: the call's host work.", render_launch),
    Section("One decode step's verification call", "h200/decode_loop.json",
            "python -m bench.run --suite decode_loop --decode-parts shape --models "
            "fast-dllm-v2-1.5b,fast-dllm-v2-7b (and --models nld-3b)",
            "The call as `generate` makes it (rows and parents copied from the host, the masked positions' "
            "logits, their confidences copied back), random bf16 weights, a 512-token prefix in a static "
            "cache of 768 keys, ms, median of 20 calls.", render_decode_loop),
    *E2E_SECTIONS,
    Section("Accuracy next to speed on the shipped model", "eval/eval.json",
            "specfold eval --tasks math,code,instruct --modes vanilla,spiffy,specfold --tau 0.1 --limit 100 "
            "--out bench/results/eval/eval.json",
            "The shipped trained model (specfold_compile/assets/specfold-tiny) and its draft graph, the "
            "held-out test split; tokens/s on the CPU, one thread.", render_eval),
    Section("SpecFold against tau on the shipped model", "eval/sweep.json",
            "specfold sweep --taus 0,0.02,0.05,0.1,0.2,0.4 --limit 30 --out-dir bench/results/eval",
            "Accuracy, speed, recompute ratio and draft fidelity of SpecFold decoding at each tau "
            "(CPU, one thread; on shared cores its tokens/s swing with the load, the eval's are steadier).",
            render_sweep),
    Section("Many requests at once: the serving engine", "h200/batched.json",
            "python -m bench.batched record --out batched_trace.pt, then python -m bench.batched replay --trace "
            "batched_trace.pt --device cuda --attention ragged --models MODEL --modes "
            "vanilla,spiffy,spiffy_compiled,specfold --concurrency 1,4,16,64 --repeats 2 [--cuda-graphs on "
            "--fold-capacity 0.5,record] --out RUN.json (one run "
            "per shape: fast-dllm-v2-1.5b, and fast-dllm-v2-7b with --pool-tokens 4096), merged with python -m "
            "bench.plot bench/results/h200/batched.json RUN.json ...",
            "The serving `Engine` (docs/serving.md) at each concurrency C (its slots), random bf16 weights of the "
            "real shapes, trace-driven: every request makes the calls, accepted drafts and tokens of the shipped "
            "model's request served through the engine (trace reproduced: every request did). Closed arrivals: C "
            "clients, each sending its next request as its last one ends; "
            "tokens/s: all requests' tokens over the wall time, latency per request from its admission; peak "
            "memory: `torch.cuda.max_memory_allocated()` (weights, KV pool, activations). Rows without CUDA "
            "graphs run the engine's batched forward launched from Python, rows with them (`--cuda-graphs on`) "
            "replay it, the block writes and the prefills (`serving/graphs.py`); both with ragged attention (one "
            "`specfold::ragged_attention` launch a layer over every request's rows). Inductor compiles each "
            "decoder layer's position-wise pieces (dynamic shapes); SpecFold (tau 0.1) is the batched folded "
            "forward with each call's recorded fold masks forced; with graphs each gate packs a fixed capacity "
            "(`--fold-capacity`: a share of 0.5 of the draft positions, or, 'capacity a gate', each gate's "
            "mean share of the record's computed positions, `serving.graphs.capacity_from_masks`, 'x M' that "
            "times M), times 1 + spread / sqrt(draft rows) (a row's `capacity_spread`: 4, the default, for "
            "'capacity a gate', 0 for the others), at least 256 positions, each gate resolving and packing by "
            "tensor ops (the engine's `gate_kernel=False`; its default, one Triton launch a gate, is measured "
            "on an H100 in docs/serving.md, 'CUDA graphs'; so do all the serving engine's replayed SpecFold rows on this "
            "page). Of the 2 timed runs a point the slower one is kept. At 7B every slot holds 4096 "
            "positions (KV pool of 64 requests x 4096 tokens: 14.0 GiB). Launched, the engine is host-bound at "
            "these shapes, and repeated runs of the same point differ by up to a half (the next section's single "
            "runs of some of the same points: 7B Spiffy at 4 requests, 156 there against 339 here).",
            render_batched),
    Section("The serving engine from CUDA graphs, host loop (H200)", "h200/batched_host.json",
            "python -m bench.batched replay --trace batched_trace.pt --device cuda --attention ragged --concurrency "
            "16,64 --repeats 1 --cuda-graphs on --fold-capacity record --models MODEL --modes MODES --out RUN.json "
            "(fast-dllm-v2-1.5b: vanilla_compiled,spiffy_compiled,specfold_compiled in one process; "
            "fast-dllm-v2-7b with --pool-tokens 4096: the two speculative modes in one process, vanilla_compiled "
            "in another), merged with python -m bench.plot bench/results/h200/batched_host.json RUN.json ...",
            "As the section above, every mode under Inductor with its passes replayed from CUDA graphs, the "
            "engine's default host loop, each gate's recorded capacity ('capacity a gate'), 4 requests a slot, "
            "one timed run a point. SpecFold against Spiffy: 1.41x / 1.88x at 1.5B (16 / 64 requests at once), "
            "2.01x / 2.45x at 7B; against vanilla 0.57x / 0.47x and 0.55x / 0.49x (docs/serving.md says why "
            "vanilla stays ahead at these concurrencies).", render_batched),
    Section("Sixteen requests at once over 256 requests (H200)", "h200/batched_c16_repeats.json",
            "python -m bench.batched replay --trace batched_trace.pt --device cuda --attention ragged --concurrency "
            "16 --per-slot 16 --repeats 3 --cuda-graphs on --fold-capacity record --models MODEL --modes "
            "spiffy_compiled,specfold_compiled --out RUN.json (one process a shape; fast-dllm-v2-7b with "
            "--pool-tokens 4096; fast-dllm-v2-1.5b with --loop host,device --rows-ahead on,off), merged with "
            "python -m bench.plot bench/results/h200/batched_c16_repeats.json RUN.json ...",
            "The two compiled speculative modes of the section above at 16 slots with 16 requests a slot, so "
            "that the engine runs full for most of the run; 3 timed runs a point, the one of median wall time "
            "kept. SpecFold against Spiffy: 1.52x at 1.5B in the host loop (3114 / 2047 tokens/s), 1.54x in the "
            "device loop (3244 / 2110), 2.12x at 7B (1175 / 555, host loop). At 1.5B the host loop's rows of "
            "the requests a block write leaves alone are built while it runs (the engine's `rows_ahead`); with "
            "every row built after the write instead (`--rows-ahead off`, the same graphs), a run takes 1.954 "
            "against 1.865 s (SpecFold) and 2.873 against 2.838 s (Spiffy): the write's wait falls from 0.19 to "
            "0.06 s while the host's own time grows by 0.02-0.07 s. The host's time outside the replayed passes "
            "(`host_s`): 0.38 / 0.44 s at 1.5B (SpecFold / Spiffy) and 0.35 / 0.30 s at 7B, against forwards "
            "(`verify_s`) of 1.30 / 2.22 s and 3.85 / 9.42 s.", render_batched),
    Section("What a packed batch of rows costs a decoder layer", "h200/packed_rows.json",
            "python -m bench.packed_rows --models fast-dllm-v2-1.5b,fast-dllm-v2-7b",
            "One decoder layer's position-wise parts (q/k/v with RoPE, output projection, MLP), random bf16 "
            "weights of each shape, over M packed rows: the median of 30 replays of its CUDA graph, each between "
            "two events. Below about 256 rows the time hardly falls with the rows (the weights' "
            "read): the floor under a SpecFold gate's packed positions (`serving.graphs.MIN_PACKED`).",
            render_packed_rows),
    Section("The serving engine's attention paths", "h200/batched_attention.json",
            "python -m bench.batched replay --trace batched_trace.pt --device cuda --models MODEL --modes MODES "
            "--attention PATH --concurrency CS, single runs in one device session: fast-dllm-v2-1.5b SpecFold "
            "ragged at 1,4,16,64 and per_request at 64; fast-dllm-v2-7b (--pool-tokens 4096) "
            "vanilla,spiffy,specfold ragged at 1,4,16,64; fast-dllm-v2-7b SpecFold per_request at 16,64; merged",
            "The engine's two attention paths (`attention=\"per_request\"`: one `branch_attention` launch a "
            "request a layer; `\"ragged\"`: one launch a layer), as in the section above, one timed run a point. "
            "The ragged path is what `Engine(attention=\"auto\")` takes on CUDA. Kernel-level timings of the "
            "two: `python -m bench.kernels.bench_ragged_attention` (`bench/kernels/results/bench_ragged_attention.json`).",
            render_batched),
]

def render(results: Path = RESULTS) -> str:
    lines = ["# Benchmarks", "",
             "Generated by `python -m bench.report > docs/benchmarks.md` from the files under "
             "`bench/results/`; each section names its file, the command that wrote it, and the hardware "
             "and versions it records. Plots: `python -m bench.plot FILE.json`.", ""]
    for s in SECTIONS:
        path = results / s.path
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        lines += [f"## {s.title}", "", s.what, "",
                  f"- file: `bench/results/{s.path}`", f"- command: `{s.command}`",
                  f"- measured on: {_versions(data)}", ""]
        lines += s.render(data)
        png = path.with_suffix(".png")
        if png.exists():
            lines += [f"![{s.title}](../bench/results/{Path(s.path).with_suffix('.png')})", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--readme-table"]:  # the per-call table README.md shows
        data = json.loads((RESULTS / "h200" / "per_check.json").read_text())
        sys.stdout.write("\n".join(render_headline(data)) + "\n")
        return 0
    if argv == ["--readme-e2e"]:  # README's headline: whole decodes
        data = json.loads((RESULTS / "h200" / "end_to_end.json").read_text())
        sys.stdout.write("\n".join(render_e2e_headline(data)) + "\n")
        return 0
    if argv == ["--readme-batched"]:  # README's serving table
        path = RESULTS / "h200" / "batched.json"
        if not path.is_file():
            raise SystemExit(f"--readme-batched: no {path.relative_to(ROOT)}; measure it first (docs/benchmarks.md)")
        sys.stdout.write("\n".join(render_batched_headline(json.loads(path.read_text()))) + "\n")
        return 0
    if argv:
        raise SystemExit("usage: python -m bench.report [--readme-table | --readme-e2e | --readme-batched]")
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
