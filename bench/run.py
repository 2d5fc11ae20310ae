"""GPU benchmark suites. ``PYTHONPATH=. python -m bench.run --suite NAME [--quick]``.

This file parses the command line and writes the results; each suite is ``bench/suites/<name>.py``. The
SpecFold flags (--dense-fraction, --one-pass-max-prefix, ...) become the backend's ``Tuning``. Every
suite's compile and first-call seconds are reported apart from the rest of its time.

Suites (each writes JSON under $OUT or bench/results/ and prints every row as JSON as it is measured):
  check       docs/SPEC.md P1/P4 of the compiled model at real shapes in bf16 (Triton kernels), judged against an
              fp32 copy, and a CUDA-graph capture of the folded forward replayed with new inputs and
              parents (no host sync).
  per_check   latency of one verification forward vs branches: dense eager, dense under Inductor,
              SpecFold at recompute ratios ~0.1/0.25/0.5, and the floor.
  memory      peak memory of one verification forward, dense vs SpecFold (7B shape).
  breakdown   time split of one forward by kernel family (torch.profiler), N = 17; --breakdown-modes.
Ablations: --specfold-no-inductor and --specfold-graph-flags add per_check modes (and breakdown modes of
the same names) with options["inductor"]=False or options["gate_flags"]="graph".
  end_to_end  vanilla / Spiffy (eager and under Inductor) / SpecFold decoding of the trained model on
              the task suite: accuracy and real tokens/s, plus tokens/s projected to the 1.5B/7B shapes
              from latencies measured here (or read from a per_check JSON with --latencies;
              bench/project.py).
  writes      latency of one block write (prefix-cache append), eager and under Inductor; rows in
              per_check's format (mode write / write_compiled), to merge into per_check.json.
  launch      host dispatch of one verification call: CUDA-graph against launched latency (plain calls,
              as generate runs them), host time to enqueue, CUDA launches per call, cProfile of the host.
  decode_loop generate() with every verification call replayed from a CUDA graph (cuda_graphs) against
              launched calls: the trained model's task suite (real tokens/s, same tokens), and ms per
              verification step at real shapes (--models, default the 1.5B).
per_check and writes rows carry both ``ms`` (CUDA-graph replays) and ``launched_ms`` (plain calls each
waited for); ``bench.project`` projects decoding with either.
"""


from __future__ import annotations

import argparse
import sys
import time
import traceback

import torch

from specfold_compile.backend.settings import Tuning

from .common import out_dir, versions, write_json
from .plot import PLOTS, plot_results
from .suites import breakdown, check, decode_loop, end_to_end, launch, memory, per_check, writes
from .suites._context import CHANGED_FOR_RATIO, MODELS, PER_CHECK_NS, BenchContext

__all__ = ["main", "SUITES", "PLOTS", "CHANGED_FOR_RATIO", "MODELS"]

SUITES = {"check": check.run, "per_check": per_check.run, "memory": memory.run, "breakdown": breakdown.run,
          "end_to_end": end_to_end.run, "writes": writes.run, "launch": launch.run, "decode_loop": decode_loop.run}


def _fraction(text: str) -> float:
    """argparse type: a float in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {value}")
    return value



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", action="append", choices=sorted(SUITES), required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for per_check")
    ap.add_argument("--no-inductor", dest="inductor", action="store_false")
    ap.add_argument("--specfold-no-inductor", action="store_true",
                    help="per_check: also time SpecFold with options['inductor']=False (ablation)")
    ap.add_argument("--specfold-graph-flags", action="store_true",
                    help="per_check: add SpecFold with options['gate_flags']='graph' (mode specfold_graph_flags)")
    ap.add_argument("--dense-fraction", type=float, default=Tuning().dense_fraction,
                    help="SpecFold Tuning.dense_fraction (default: the backend's)")
    ap.add_argument("--min-spill-us", type=float, default=Tuning().min_spill_us,
                    help="SpecFold Tuning.min_spill_us (per_check, breakdown, end_to_end; default: the backend's)")
    ap.add_argument("--fold-launched", action="store_true",
                    help="SpecFold with Tuning.fold_launched=True: launched calls (launched_ms, the launch "
                         "suite) fold too; by default they run the plain graph, CUDA-graph captures fold")
    ap.add_argument("--fold-min-branches", type=int, default=None,
                    help="SpecFold Tuning.fold_min_branches (per_check, launch; default None: the cost model)")
    ap.add_argument("--logit-fraction", type=_fraction, default=None,
                    help="per_check: logits of this fraction of the N x B positions only (logit_positions; the "
                         "decode loop asks for the masked ones, 59-62%% of a multi-branch call's); rows get "
                         "logit_fraction. Default: every position's")
    ap.add_argument("--combo-kernels", action="store_true",
                    help="per_check / breakdown: SpecFold with Tuning.combo_kernels (Inductor combines "
                         "independent kernels into one launch; per_check rows get combo_kernels=true)")
    ap.add_argument("--fold-head", action="store_true", help="per_check: SpecFold with options['fold_head'] (its rows get fold_head=true)")
    ap.add_argument("--no-fuse-projections", dest="fuse_projections", action="store_false",
                    help="check / per_check / writes / memory / breakdown: models with q/k/v and gate/up as "
                         "separate GEMMs (the models' default fuses them); per_check rows get "
                         "fused_projections=false")
    ap.add_argument("--one-pass-max-prefix", type=int, default=None,
                    help="SpecFold's folded attention in one launch up to this many prefix keys (Tuning."
                         "one_pass_max_prefix; -1 = always prefix states + block merge, the ablation); per_check "
                         "rows get the value")
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU, to test the suites")
    ap.add_argument("--models", type=lambda v: tuple(v.split(",")), default=None,
                    help=f"per_check / breakdown / writes: comma-separated subset of {','.join(MODELS)}")
    ap.add_argument("--ns", type=lambda v: tuple(int(x) for x in v.split(",")), default=None,
                    help=f"per_check: branch counts (default {','.join(map(str, PER_CHECK_NS))}); "
                         "breakdown: (default 17)")
    ap.add_argument("--prefixes", type=lambda v: tuple(int(x) for x in v.split(",")), default=None,
                    help="per_check, writes: prefix lengths (default 512,2048)")
    ap.add_argument("--ratios", type=lambda v: tuple(float(x) for x in v.split(",")), default=None,
                    help=f"per_check: target recompute ratios, a subset of {sorted(CHANGED_FOR_RATIO)} "
                         "(anything else is an error)")
    ap.add_argument("--breakdown-modes", type=lambda v: tuple(v.split(",")), default=("specfold",),
                    help="breakdown: profile these of dense,dense_compiled,specfold,specfold_no_inductor,"
                         "specfold_graph_flags")
    ap.add_argument("--limit", type=int, default=30, help="problems per task (end_to_end)")
    ap.add_argument("--latencies", default=None,
                    help="end_to_end: project through this per_check JSON instead of measuring latencies")
    ap.add_argument("--draft-budget", type=int, default=16, help="Spiffy D* (end_to_end)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="end_to_end: timed passes (modes alternate per problem; median per problem)")
    ap.add_argument("--decode-parts", type=lambda v: tuple(v.split(",")), default=("trained", "shape"),
                    help="decode_loop: trained (the task suite), shape (ms per step at --models), writes (one block "
                         "write at --models, dynamic vs static cache, launched vs replayed), windows (replayed "
                         "calls and writes at --models through attention windows vs the whole capacity of a "
                         "4096-key cache); "
                         "comma-separated")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.ratios or ()) - set(CHANGED_FOR_RATIO))
    if unknown:  # a filter that matches nothing would drop every SpecFold row without a word
        ap.error(f"--ratios: expected target ratios among {sorted(CHANGED_FOR_RATIO)}, got {unknown} "
                 "(the measured recompute ratios, e.g. 0.1875, are in the rows, not the targets)")
    if args.fold_head and args.logit_fraction is not None:  # its rows would say fold_head for a dense head
        ap.error("--fold-head with --logit-fraction: the head gate runs on every row; selected logits leave the "
                 "head dense")
    if args.one_pass_max_prefix is not None and args.one_pass_max_prefix < -1:
        ap.error(f"--one-pass-max-prefix: expected a prefix length >= -1, got {args.one_pass_max_prefix}")
    if args.cpu_dry_run:
        ctx = BenchContext.dry_run()
    elif not torch.cuda.is_available():
        print("bench.run needs a CUDA device", file=sys.stderr)
        return 2
    else:
        ctx = BenchContext()
    from specfold_compile.cli.arguments import UsageError, require_module

    try:  # the results directory and the plots' package, before the measurements, not after them
        out = out_dir("/tmp/specfold-bench-dry" if args.cpu_dry_run else "bench/results")
        if any(suite in PLOTS for suite in args.suite):
            require_module("matplotlib", "plotting the suites' results", "plot")
    except UsageError as e:
        ap.error(str(e))
    print(versions(), flush=True)
    status = 0
    for suite in args.suite:
        t0 = time.monotonic()
        ctx.compile_s = 0.0
        try:
            rows = SUITES[suite](args, ctx)
        except Exception:
            traceback.print_exc()
            status = 1
            continue
        seconds = time.monotonic() - t0
        write_json(out / f"{suite}.json", rows, {"suite": suite, "seconds": seconds, "compile_seconds": ctx.compile_s})
        print(f"== {suite}: {len(rows)} rows in {seconds:.0f}s (compiles and first calls {ctx.compile_s:.0f}s, "
              f"steady state {seconds - ctx.compile_s:.0f}s)", flush=True)
        if suite in PLOTS and rows:
            print(f"== {suite}: plotted {plot_results(out / f'{suite}.json')}", flush=True)
        if suite == "check" and not all(r.get("ok") for r in rows):
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
