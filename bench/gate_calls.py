"""Whole folded calls with the fold gate's two launches set one way or another, alternating in one process:
the ``per_check`` suite (prefix 512, N = 17 and 33, recompute ratios about 0.06 and 0.19, masked positions'
logits only, replayed from CUDA graphs) once per variant and repeat, dense under Inductor in the first run.

Variants: ``default``; ``flags_4rows_1024`` (the flag launch with four rows a program in 1024-channel chunks
and four warps instead of ``gate.flag_config``); ``resolve_global_memory`` (the resolve's pointer jumping
through global memory, as tiles past ``gate.REGISTER_TILE_MAX`` run it); both, joined by ``+``.

    PYTHONPATH=. python -m bench.gate_calls --models fast-dllm-v2-1.5b --out gate_calls.json \
        --variants default,flags_4rows_1024,flags_4rows_1024+resolve_global_memory

Rows: per_check's, with ``gate_variant`` and ``repeat``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
from pathlib import Path
from unittest import mock

import triton

from specfold_compile.kernels import gate

from . import run as bench_run
from .common import check_output, write_json

PATCHES = {
    "flags_4rows_1024": lambda: mock.patch.object(
        gate, "flag_config", lambda C: (4, min(triton.next_power_of_2(max(C, 1)), 1024), 4)),
    "resolve_global_memory": lambda: mock.patch.object(gate, "REGISTER_TILE_MAX", 0),
}


def patched(variant: str) -> contextlib.ExitStack:
    """The variant's patches entered (``default``: none)."""
    stack = contextlib.ExitStack()
    for name in [] if variant == "default" else variant.split("+"):
        stack.enter_context(PATCHES[name]())
    return stack


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="fast-dllm-v2-1.5b", help="comma-separated per_check model names")
    ap.add_argument("--variants", type=lambda v: v.split(","), default=["default", *PATCHES],
                    help=f"comma-separated: default, or names from {', '.join(PATCHES)} joined by +")
    ap.add_argument("--repeats", type=int, default=2, help="runs of every variant, alternating")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU, to test the script")
    args = ap.parse_args(argv)
    unknown = [v for v in args.variants if v != "default" and not all(p in PATCHES for p in v.split("+"))]
    if unknown:
        ap.error(f"--variants: expected default or names from {', '.join(PATCHES)} joined by +, "
                 f"got {', '.join(unknown)}")
    if args.repeats < 1:
        ap.error(f"--repeats: expected at least 1, got {args.repeats}")
    check_output(ap, args.out)
    suite = ["--suite", "per_check", "--models", args.models, "--prefixes", "512", "--ns", "17,33",
             "--ratios", "0.1,0.25", "--logit-fraction", "0.6", "--budget", "600"]
    suite += ["--cpu-dry-run"] if args.cpu_dry_run else []
    procedure = (f"bench.gate_calls: per_check runs of {args.models} alternating in one process, "
                 f"{args.repeats} repeat(s) of {', '.join(args.variants)}; dense under Inductor in the first run")
    rows = []
    # OUT (where bench.run writes each run's per_check.json) is the caller's again afterwards
    with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ):
        for repeat in range(1, args.repeats + 1):
            for variant in args.variants:
                run_dir = Path(tmp) / f"{variant}_{repeat}"
                os.environ["OUT"] = str(run_dir)
                with patched(variant):
                    bench_run.main(suite + ([] if not rows else ["--no-inductor"]))
                run_rows = json.loads((run_dir / "per_check.json").read_text())["rows"]
                rows += [{**r, "gate_variant": variant, "repeat": repeat} for r in run_rows
                         if r["mode"] in ("specfold", "dense_compiled")]
                # after every run, so that a run cut short keeps the rows measured so far
                write_json(Path(args.out), rows, {"suite": "gate_calls", "procedure": procedure})
    for r in rows:
        print(r["model"], r["n_branches"], r["mode"], r["gate_variant"], r["repeat"], f"{r['ms']:.4f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
