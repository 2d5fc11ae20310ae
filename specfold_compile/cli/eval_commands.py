"""``specfold eval`` and ``specfold sweep``: the task-suite evaluation and the ``tau`` sweep (``eval``),
every argument checked before the model loads; reports written as JSON (and the sweep's CSV) before
anything that could fail after the compute (the plot)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from ..eval.plot import plot_sweep
from ..eval.report import format_sweep_table, format_table, jsonable, machine, model_name, versions
from ..eval.run import MODES, evaluate
from ..eval.sweep import sweep, write_sweep_csv
from ..loading import load_model, resolve_draft_graph
from . import arguments
from .cuda_graphs import add_cuda_graphs_argument, check_cuda_graphs_argument
from .options import add_kernels_argument, add_model_arguments, check_kernels


def add_suite_arguments(ap, default_limit: int) -> None:
    """The task selection and run settings shared by eval and sweep."""
    from ..tasks import TASKS  # noqa: PLC0415

    ap.add_argument("--tasks", type=arguments.names(TASKS, "tasks"), default=list(TASKS))
    ap.add_argument("--limit", type=arguments.positive_int, default=default_limit,
                    help="first N test-split problems per task")
    add_model_arguments(ap)
    add_kernels_argument(ap)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    ap.add_argument("--unsafe-run-code", action="store_true",
                    help="where no sandbox can be built (bubblewrap missing, namespaces denied), run the "
                    "model-generated code of the code task WITHOUT isolation, as the invoking user")


def check_suite_inputs(a) -> None:
    """Before loading anything: the code task's sandbox (or --unsafe-run-code), the kernels' package,
    the model's inputs."""
    from ..tasks.sandbox import SandboxUnavailable, require_sandbox  # noqa: PLC0415

    if "code" in a.tasks and not a.unsafe_run_code:
        try:
            require_sandbox()
        except SandboxUnavailable as e:
            raise arguments.UsageError(f"--tasks code: {e}") from None
    check_kernels(a.kernels)
    arguments.check_model_inputs(a)


def eval_cli(argv=None) -> int:
    """``specfold eval``: accuracy and speed of vanilla / Spiffy / SpecFold decoding on the test split."""
    ap = argparse.ArgumentParser(prog="specfold eval", description=eval_cli.__doc__)
    ap.add_argument("--modes", type=arguments.names(MODES, "modes"), default=list(MODES))
    ap.add_argument("--tau", type=arguments.tau, default=0.1)
    ap.add_argument("--draft-budgets", type=arguments.nonnegative_ints, default=None,
                    help="comma-separated budgets; Spiffy/SpecFold run per budget")
    add_suite_arguments(ap, default_limit=50)
    ap.add_argument("--fold-head", action="store_true",
                    help="SpecFold also folds the final norm and LM head (options['fold_head'])")
    add_cuda_graphs_argument(ap)
    ap.add_argument("--out", default=None, help="write the JSON report here")
    a = ap.parse_args(argv)
    with arguments.reporting_user_errors(ap.prog), arguments.one_line_warnings():
        check_cuda_graphs_argument(ap, a.cuda_graphs, a.device)
        check_suite_inputs(a)
        if a.out:
            arguments.output_file(a.out, "--out")
        return run_eval(a)


def run_eval(a) -> int:
    budgets = a.draft_budgets or [a.draft_budget]
    t0 = time.perf_counter()
    model = load_model(a.model, device=a.device, chat_template=not a.no_chat_template)
    model.eval()
    graph = resolve_draft_graph(a.model, a.draft_graph)
    rep = evaluate(model, a.tasks, a.modes, limit=a.limit, tau=a.tau, draft_budgets=budgets, draft_graph=graph,
                   max_new_tokens=a.max_new_tokens, threshold=a.threshold, seed=a.seed, device=a.device,
                   kernels=a.kernels, fold_head=a.fold_head, progress=not a.quiet, cuda_graphs=a.cuda_graphs,
                   unsafe_run_code=a.unsafe_run_code)
    report = {
        "results": rep["results"],
        "spiffy_tokens_equal_vanilla": rep["spiffy_tokens_equal_vanilla"],
        "specfold_sequences_equal_vanilla_share": rep["specfold_sequences_equal_vanilla_share"],
        "model": model_name(model, a.model),
        "settings": {"tasks": a.tasks, "modes": a.modes, "tau": a.tau, "limit": a.limit, "split": "test",
                     "draft_budgets": budgets, "draft_graph": graph or "decoding default",
                     "max_new_tokens": a.max_new_tokens, "threshold": a.threshold, "kernels": a.kernels,
                     "fold_head": a.fold_head, "cuda_graphs": a.cuda_graphs, "device": a.device, "seed": a.seed,
                     "unsafe_run_code": a.unsafe_run_code,
                     "torch_threads": torch.get_num_threads()},
        "versions": versions(),
        "machine": machine(a.device),
        "compile_seconds": rep["compile_seconds"],
        "warmup_seconds": rep["warmup_seconds"],
        "dynamo_graphs": rep["dynamo_graphs"],
        "eval_seconds": rep["eval_seconds"],
        "total_seconds": time.perf_counter() - t0,
    }
    if a.out:  # the measurements first
        Path(a.out).write_text(json.dumps(jsonable(report), indent=2) + "\n")
        print(f"wrote {a.out}", file=sys.stderr)
    print(format_table(rep["results"]))
    print(f"spiffy tokens equal vanilla: {rep['spiffy_tokens_equal_vanilla']}")
    if any(v for v in (rep["specfold_sequences_equal_vanilla_share"] or {}).values()):
        print(f"specfold sequences equal vanilla (share): {rep['specfold_sequences_equal_vanilla_share']}")
    print(f"compile/warm-up seconds (not in tokens/s): { {k: round(v, 2) for k, v in rep['warmup_seconds'].items()} }")
    ok = all(v is not False for v in rep["spiffy_tokens_equal_vanilla"].values())
    if not ok:
        print("ERROR: Spiffy tokens differ from vanilla (lossless speculation violated)", file=sys.stderr)
    return 0 if ok else 1


def sweep_cli(argv=None) -> int:
    """``specfold sweep``: SpecFold accuracy, speed, recompute ratio and draft fidelity against tau.
    Writes sweep.csv, sweep.json and (unless ``--no-plot``; needs matplotlib) sweep.png to ``--out-dir``."""
    ap = argparse.ArgumentParser(prog="specfold sweep", description=sweep_cli.__doc__)
    ap.add_argument("--taus", type=arguments.taus, default=[0.0, 0.02, 0.05, 0.1, 0.2, 0.4])
    add_suite_arguments(ap, default_limit=30)
    ap.add_argument("--fidelity-every", type=arguments.positive_int, default=1,
                    help="measure fidelity on every k-th multi-branch call")
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--no-plot", action="store_true", help="skip sweep.png (which needs matplotlib)")
    a = ap.parse_args(argv)
    with arguments.reporting_user_errors(ap.prog), arguments.one_line_warnings():
        if not a.no_plot:
            arguments.require_module("matplotlib", "sweep.png", "plot", "pass --no-plot")
        check_suite_inputs(a)
        arguments.output_dir(a.out_dir, "--out-dir")
        return run_sweep(a)


def run_sweep(a) -> int:
    taus, tasks = a.taus, a.tasks
    t0 = time.perf_counter()
    model = load_model(a.model, device=a.device, chat_template=not a.no_chat_template)
    model.eval()
    graph = resolve_draft_graph(a.model, a.draft_graph)
    rep = sweep(model, taus, tasks, limit=a.limit, draft_budget=a.draft_budget, draft_graph=graph,
                max_new_tokens=a.max_new_tokens, threshold=a.threshold, seed=a.seed, device=a.device,
                kernels=a.kernels, fidelity_every=a.fidelity_every, progress=not a.quiet,
                unsafe_run_code=a.unsafe_run_code)
    out = Path(a.out_dir)
    meta = {"rows": rep["rows"], "spiffy_accuracy": rep["spiffy_accuracy"], "warmup_seconds": rep["warmup_seconds"],
            "fidelity_calls": rep["fidelity_calls"], "model": model_name(model, a.model),
            "settings": {"taus": taus, "tasks": tasks, "limit": a.limit, "split": "test",
                         "draft_budget": a.draft_budget, "draft_graph": graph or "decoding default",
                         "max_new_tokens": a.max_new_tokens, "threshold": a.threshold, "kernels": a.kernels,
                         "fidelity_every": a.fidelity_every, "seed": a.seed, "unsafe_run_code": a.unsafe_run_code,
                         "fidelity_positions": "draft rows n>=1, token == mask id; copy = parent's dense logits"},
            "versions": versions(), "machine": machine(a.device),
            "total_seconds": time.perf_counter() - t0}
    # The measurements first: a failing plot loses nothing.
    written = [out / "sweep.csv", out / "sweep.json"]
    write_sweep_csv(rep["rows"], tasks, written[0])
    written[1].write_text(json.dumps(jsonable(meta), indent=2) + "\n")
    if not a.no_plot:
        plot_sweep(rep["rows"], tasks, out / "sweep.png")
        written.append(out / "sweep.png")
    print(format_sweep_table(rep["rows"], tasks))
    print(f"wrote {', '.join(map(str, written))}", file=sys.stderr)
    return 0
