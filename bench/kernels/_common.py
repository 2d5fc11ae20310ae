"""Shared harness of the kernel benchmarks: shapes, timing, roofline floors, JSON output.

Run from the repository root, as ``python -m bench.kernels.NAME`` or ``PYTHONPATH=. python
bench/kernels/NAME.py``; on a machine without CUDA, TRITON_INTERPRET=1 is set automatically (use
--quick there: interpreted kernels are slow).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

if not torch.cuda.is_available():  # before triton is imported: @triton.jit reads it at decoration time
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (after TRITON_INTERPRET, before any kernel module)

from bench.common import COPY_BW as HBM_BYTES_PER_S  # noqa: E402  (one copy of the H200 ceilings)
from bench.common import MATMUL_FLOPS as BF16_FLOPS_PER_S  # noqa: E402
from bench.common import versions  # noqa: E402
from specfold_compile import testing as _testing  # noqa: E402

rel_err = _testing.rel_err  # the benchmarks' C.rel_err: max |out - ref| / max |ref|, optionally under a mask

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    # interpreted smoke runs: the interpreter's bf16 dot/cast are wrong without the test patch
    try:
        _testing.install_interpreter_bf16_patch()
    except Exception as exc:  # pragma: no cover
        print(f"warning: interpreter bf16 patch not installed: {exc!r}", file=sys.stderr)

MODELS = {
    # name: hidden, q heads, kv heads, head dim, ffn
    "fastdllm-1.5b": dict(hidden=1536, hq=12, hkv=2, d=128, ffn=8960),
    "fastdllm-7b": dict(hidden=3584, hq=28, hkv=4, d=128, ffn=18944),
}
QUICK_MODELS = {"quick": dict(hidden=64, hq=4, hkv=2, d=16, ffn=96)}
BLOCK = 32
PREFIXES = [512, 2048]
NS = [5, 9, 17, 33]


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def parse_args(argv=None, desc="", extra=None):
    """The shared options; ``extra(ap)`` adds a benchmark's own."""
    ap = argparse.ArgumentParser(description=desc)
    if extra is not None:
        extra(ap)
    ap.add_argument("--out", default=None, help="write results as JSON here")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (interpreter smoke run)")
    ap.add_argument("--models", default=None, help="comma-separated subset of models")
    ap.add_argument("--ns", default=None, help="comma-separated branch counts (default: 5,9,17,33)")
    ap.add_argument("--prefixes", default=None, help="comma-separated prefix lengths (default: 512,2048)")
    return ap.parse_args(argv)


def configs(args):
    """(model name, dims, block, prefixes, Ns) for the selected mode."""
    if args.quick:
        return QUICK_MODELS, 4, [8], [2, 3]
    models = MODELS
    if args.models:
        models = {k: MODELS[k] for k in args.models.split(",")}
    ns = [int(n) for n in args.ns.split(",")] if getattr(args, "ns", None) else NS
    prefixes = [int(p) for p in args.prefixes.split(",")] if getattr(args, "prefixes", None) else PREFIXES
    return models, BLOCK, prefixes, ns


def bench(fn, quick=False, graph=True) -> float:
    """Median time of fn() in milliseconds: of CUDA-graph replays, or with ``graph=False`` of calls launched
    from Python (their launch cost included where it exceeds the GPU's work)."""
    if torch.cuda.is_available() and not interpreting():
        import triton.testing

        fn()  # compile / autotune outside any graph capture
        torch.cuda.synchronize()
        if graph:
            try:
                # CUDA-graph replays: device time without the Python launch cost (as in deployment)
                return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))
            except Exception:
                pass
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    times = []
    for _ in range(1 if quick else 3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def floor_ms(bytes_moved: float, flops: float) -> dict:
    t_mem = bytes_moved / HBM_BYTES_PER_S * 1e3
    t_fl = flops / BF16_FLOPS_PER_S * 1e3
    return dict(bytes=bytes_moved, flops=flops, floor_mem_ms=t_mem, floor_flop_ms=t_fl,
                floor_ms=max(t_mem, t_fl))


def emit(name: str, rows: list, args) -> dict:
    res = dict(benchmark=name, device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               interpreted=interpreting(), **versions(), quick=bool(args.quick), results=rows)
    for r in rows:
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {args.out}", file=sys.stderr)
    return res
