"""The ``end_to_end`` suite: vanilla / Spiffy (eager and under Inductor) / SpecFold decoding of the trained
model on the task suite: accuracy and real tokens/s, plus tokens/s projected to the 1.5B/7B shapes from
latencies measured here (or read from a per_check JSON with --latencies; bench/project.py)."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from specfold_compile.backend import collect_stats, specfold_backend

from ..common import Deadline
from . import per_check
from ._context import BenchContext, tuning

MODES = ("vanilla", "spiffy", "spiffy_compiled", "specfold", "specfold_fold_all")


class CallRecorder:
    """Wraps a verification callable: records (N, recompute ratio) of every call; decoding is unchanged."""

    def __init__(self, inner, base) -> None:
        self.inner, self.base, self.calls = inner, base, []
        self.config, self.prefill, self.write_block = base.config, base.prefill, base.write_block

    def __call__(self, tokens, parents, cache, logit_positions=None):
        with collect_stats() as s:
            out = self.inner(tokens, parents, cache, logit_positions=logit_positions)
        self.calls.append((tokens.shape[0], s))
        return out

    def ratios(self) -> list[tuple[int, float]]:
        return [(n, 1.0 if n == 1 or not s.layers else s.recompute_ratio) for n, s in self.calls]


def _latency_rows(args, ctx: BenchContext, name: str, ns: list[int], deadline: Deadline) -> list[dict]:
    """per_check rows at a real shape, prefix 512, for the Ns a decoding run used (with this run's
    SpecFold options, and dense under Inductor when not --no-inductor)."""
    sub = argparse.Namespace(**{**vars(args), "models": (name,), "ns": tuple(ns), "prefixes": (512,),
                                "ratios": None, "budget": deadline.left(), "specfold_no_inductor": False,
                                "specfold_graph_flags": False})
    return per_check.run(sub, ctx)


def _task_rows(args, ctx: BenchContext, model, compiled: dict, graph: str | None, task: str) -> list[dict]:
    """Every mode's decoding of one task: a warm-up pass (compiles, recompiles for new shapes, kernel
    autotuning), then ``--repeats`` timed passes."""
    from specfold_compile.decoding import generate
    from specfold_compile.loading import encode
    from specfold_compile.tasks import sample, score_many

    limit = min(args.limit, 10) if args.quick else args.limit
    problems = sample(task, "test", limit, 0)
    prompts = [encode(model, prob.prompt).to(ctx.device) for prob in problems]
    targets = {mode: compiled.get(mode, model) for mode in MODES}
    kws = {mode: dict(mode="vanilla" if mode == "vanilla" else "spiffy", max_new_tokens=96,
                      draft_budget=args.draft_budget, draft_graph=graph, compile_writes=mode in compiled)
           for mode in MODES}
    recorders, warm_s = {}, {}
    for mode in MODES:
        # Warm-up pass over every problem, recording each call's N and recompute ratio.
        recorders[mode] = CallRecorder(targets[mode], model)
        _, warm_s[mode] = ctx.first_call(lambda: [generate(recorders[mode], p, **kws[mode]) for p in prompts])
    # Timed passes: the tiny model is host-bound, so one pass swings by +-30% run to run (H200). Modes
    # alternate problem by problem, and each problem's time is its median over the repeats, so drift and
    # jitter hit every mode alike.
    walls = {mode: [[] for _ in prompts] for mode in MODES}
    results: dict = {}
    for rep in range(args.repeats):
        for i, prompt in enumerate(prompts):
            for mode in MODES:
                res = generate(targets[mode], prompt, **kws[mode])
                walls[mode][i].append(res.wall_time_s)
                if rep == 0:
                    results.setdefault(mode, []).append(res)
    rows = []
    for mode in MODES:
        res_list = results[mode]
        texts = [model.tokenizer.decode(r.tokens[:r.tokens.index(model.config.eos_token_id)]
                                        if model.config.eos_token_id in r.tokens else r.tokens,
                                        skip_special_tokens=True) for r in res_list]
        tokens = sum(len(r.tokens) for r in res_list)
        calls = sum(r.num_calls for r in res_list)
        accepted = sum(st.accepted for r in res_list for st in r.steps)
        nfe = sum(r.nfe for r in res_list)
        wall = sum(statistics.median(w) for w in walls[mode])
        acc = sum(score_many(problems, texts)) / len(problems)
        recorder = recorders[mode]
        call_ratios = recorder.ratios()
        ratio_draft = [st.recompute_ratio for n, st in recorder.calls if n > 1 and st.layers]  # folded calls
        rows.append({"task": task, "mode": mode, "accuracy": acc, "n": len(problems), "tokens": tokens,
                     "nfe": nfe / len(problems), "tokens_per_s": tokens / wall, "warmup_s": warm_s[mode],
                     "tokens_per_s_per_pass": [tokens / sum(w[r] for w in walls[mode]) for r in range(args.repeats)],
                     "accepted_per_call": accepted / max(calls, 1),
                     "recompute_ratio": (sum(ratio_draft) / len(ratio_draft)) if ratio_draft else None,
                     "folded_calls": sum(1 for _, st in recorder.calls if st.layers),
                     "compile_writes": kws[mode]["compile_writes"],
                     "kind": f"measured (trained 3.8M model, {ctx.device_name()})"})
        print(json.dumps(rows[-1]), flush=True)
        rows[-1].update(forwards=nfe, calls=[(n, round(r, 4)) for n, r in call_ratios])
    return rows


def run(args, ctx: BenchContext) -> list[dict]:
    """Vanilla / Spiffy / SpecFold decoding of the trained model on the task suite (real accuracy and
    tokens/s on this GPU), plus tokens/s PROJECTED to the 1.5B/7B shapes by replaying every run's
    verification calls (N, measured recompute ratio) through latencies measured in this run (or read
    from a per_check JSON with --latencies; see bench/project.py)."""
    from specfold_compile.loading import DEFAULT_MODEL_DIR, load_model
    from specfold_compile.tasks import TASKS

    from ..project import LATENCIES, SHAPES, project_all

    deadline = Deadline(args.budget)
    model = load_model(None, device=ctx.device)
    graph_file = Path(DEFAULT_MODEL_DIR) / "draft_graph.json"
    graph = str(graph_file) if graph_file.is_file() else None
    options = {"tau": 0.1, "kernels": ctx.kernels}
    # The default decides per call whether folding pays (on this tiny model it never does, so its calls
    # run the plain graph); fold_all folds every multi-branch call, which measures the recompute ratios
    # the projections to real shapes replay.
    # spiffy_compiled: Spiffy under torch.compile's default backend, the fair baseline for a compiled
    # SpecFold. Compiled modes compile the prefill and block writes too (generate(compile_writes=True)),
    # as a decode loop that compiles its model would.
    compiled = {"specfold": torch.compile(model, backend=specfold_backend,
                                          options={**options, "tuning": tuning(args, "min_spill_us")}),
                "specfold_fold_all": torch.compile(model, backend=specfold_backend, options={
                    **options, "tuning": tuning(args, "min_spill_us", fold_min_branches=2)}),
                "spiffy_compiled": torch.compile(model)}
    rows = []
    for task in TASKS:
        rows += _task_rows(args, ctx, model, compiled, graph, task)
    ns = sorted({n for r in rows for n, _ in r["calls"]} | {1})
    latency_rows = json.loads(Path(args.latencies).read_text())["rows"] if args.latencies else []
    for shape in SHAPES if not args.latencies else ():
        if deadline.left() < 60:
            break
        latency_rows += _latency_rows(args, ctx, shape, ns, deadline)
    measured = list(rows)
    for latency in LATENCIES:  # CUDA-graph latencies, and launched ones where the rows have them
        rows += project_all(measured, latency_rows, 512, latency)
    for r in rows:
        if r.get("kind", "").startswith("projected"):
            print(json.dumps(r), flush=True)
    return rows
