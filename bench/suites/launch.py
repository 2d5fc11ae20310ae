"""The ``launch`` suite: host dispatch of one verification call: CUDA-graph against launched latency (plain
calls, as generate runs them), host time to enqueue, CUDA launches per call, cProfile of the host."""

from __future__ import annotations

import json
import statistics
import time
import traceback

import torch

from specfold_compile.backend import collect_stats, fold_launched_calls, specfold_backend

from ..common import out_dir, time_launched
from ._context import CHANGED_FOR_RATIO, TAU, BenchContext, timed, tuning


def _host_probe(ctx: BenchContext, sync, launches: int = 2000) -> dict:
    """This host's cost of one launch, apart from any model: a tiny in-place add (eager PyTorch) and,
    on CUDA, an empty Triton kernel (Triton's Python launcher, as our kernels launch), us per launch."""
    x = torch.zeros(16, device=ctx.device)

    def per_launch_us(fn) -> float:
        for _ in range(50):
            fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(launches):
            fn()
        sync()
        return 1e6 * (time.perf_counter() - t0) / launches

    row = {"mode": "host_probe", "eager_add_us": per_launch_us(lambda: x.add_(1))}
    if ctx.device == "cuda":
        import triton

        @triton.jit
        def _touch(ptr):
            pass

        row["triton_launch_us"] = per_launch_us(lambda: _touch[(1,)](x))
    return row


def _host_numbers(ctx: BenchContext, call, sync) -> tuple[list[float], float, object]:
    """Host time to enqueue a call (10 calls), CUDA launches per call (profiler), cProfile of 10 calls."""
    import cProfile

    from torch.profiler import ProfilerActivity, profile

    host = []
    for _ in range(10):
        sync()
        t0 = time.perf_counter()
        call()
        host.append(1e3 * (time.perf_counter() - t0))
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(5):
            call()
        sync()
    launches = sum(e.count for e in prof.key_averages() if "LaunchKernel" in e.key or "cuLaunch" in e.key) / 5
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(10):
        call()
    sync()
    profiler.disable()
    return host, launches, profiler


def run(args, ctx: BenchContext) -> list[dict]:
    """Host dispatch of one verification call (prefix 512, N = 1 and 17 or --ns, r ~ 0.25, --logit-fraction
    as per_check): CUDA-graph latency (``ms``) against plain calls each waited for (``launched_ms``, what
    ``generate`` pays), the host's time to enqueue a call (``host_ms``: the call returns before its kernels
    finish), CUDA launches per call (torch.profiler's runtime events), and the host's hottest functions
    (cProfile, ``launch_profile_*.txt``) for dense under Inductor and SpecFold; first, this host's cost of one
    launch apart from any model (``host_probe``)."""
    import io
    import pstats

    sync = torch.cuda.synchronize if ctx.device == "cuda" else (lambda: None)
    rows = [_host_probe(ctx, sync)]
    print(json.dumps(rows[-1]), flush=True)
    for name in args.models or ("fast-dllm-v2-1.5b",):
        torch._dynamo.reset()
        model = ctx.model(args, name)
        cache = ctx.prefix(model, 512, 1)
        options = {"tau": TAU, "kernels": ctx.kernels,
                   "tuning": tuning(args, "dense_fraction", "min_spill_us", "fold_min_branches", "fold_launched")}
        fns = {"dense_compiled": torch.compile(model.verify, dynamic=True),
               "specfold": torch.compile(model, backend=specfold_backend, options=options)}
        for n_rows, mode in [(n, m) for n in (args.ns or (1, 17)) for m in fns]:
            tokens, parents = ctx.inputs(model, n_rows, CHANGED_FOR_RATIO[0.25], n_rows, cache)
            logits_at = ctx.logit_positions(n_rows, model.config.block_size, args.logit_fraction, n_rows)
            call = lambda: fns[mode](tokens, parents, cache, logits_at)  # noqa: E731
            try:
                with torch.no_grad():
                    with collect_stats() as s, fold_launched_calls():
                        # folded where a capture folds: the gates' decisions, and the graph warmed
                        _, first_s = ctx.first_call(call)
                    times = timed(call)
                    if mode == "specfold":  # launched and folded (as with fold_launched=True)
                        with fold_launched_calls():
                            times["launched_folded_ms"] = time_launched(call)
                    host, launches, profiler = _host_numbers(ctx, call, sync)
                text = io.StringIO()
                for order in ("tottime", "cumulative"):
                    pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(30)
                (out_dir() / f"launch_profile_{name}_{mode}_n{n_rows}.txt").write_text(
                    f"cProfile of 10 calls, {name}, {mode}, N = {n_rows}, prefix 512\n" + text.getvalue())
                rows.append({"model": name, "prefix": 512, "n_branches": n_rows, "mode": mode,
                             "recompute_ratio": s.recompute_ratio if s.layers else 1.0, "folded": bool(s.layers),
                             **times, "host_ms": statistics.median(host), "launches_per_call": launches,
                             "fold_launched": args.fold_launched,
                             "first_call_s": first_s,
                             **({} if args.logit_fraction is None else {"logit_fraction": args.logit_fraction})})
            except Exception as exc:
                traceback.print_exc()
                rows.append({"model": name, "n_branches": n_rows, "mode": "error", "what": mode,
                             "error": repr(exc)[:300]})
            print(json.dumps(rows[-1]), flush=True)
        del model, cache, fns
        ctx.empty_cache()
    return rows
