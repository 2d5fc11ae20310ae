"""The ``memory`` suite: peak memory of one verification forward, dense against SpecFold (7B shape)."""

from __future__ import annotations

import json

import torch

from specfold_compile.backend import fold_launched_calls, specfold_backend

from ._context import TAU, BenchContext, tuning


def run(args, ctx: BenchContext) -> list[dict]:
    if ctx.device != "cuda":
        print("this suite measures CUDA memory/kernels: skipped in --cpu-dry-run", flush=True)
        return []
    rows = []
    name = "fast-dllm-v2-7b"
    torch._dynamo.reset()
    model = ctx.model(args, name)
    folded = torch.compile(model, backend=specfold_backend,
                           options={"tau": TAU, "kernels": ctx.kernels, "tuning": tuning(args)})
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for prefix in (2048, 8192):
        cache = ctx.prefix(model, prefix, 1)
        cache_bytes = sum(t.numel() * t.element_size() for t in cache.keys + cache.values)
        for n_rows in (1, 9, 33):
            tokens, parents = ctx.inputs(model, n_rows, 6, n_rows, cache)
            for mode, fn in (("dense", lambda: model.verify(tokens, parents, cache)),
                             ("specfold", lambda: folded(tokens, parents, cache))):
                # the folded forward's memory where the backend folds (also launched, as a capture would)
                with torch.no_grad(), fold_launched_calls():
                    ctx.first_call(fn)  # compile / warm up outside the measurement
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    out = fn()
                    torch.cuda.synchronize()
                    peak = torch.cuda.max_memory_allocated()
                    del out
                rows.append({"model": name, "prefix": prefix, "n_branches": n_rows, "mode": mode,
                             "peak_bytes": peak, "extra_bytes": peak - base, "weight_bytes": weight_bytes,
                             "cache_bytes": cache_bytes,
                             "per_branch_cache_copy_bytes": cache_bytes * n_rows})
                print(json.dumps(rows[-1]), flush=True)
        del cache
    return rows
