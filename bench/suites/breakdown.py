"""The ``breakdown`` suite: kernel time per part of one verification forward (torch.profiler, prefix 512,
N = 17 or --ns), for the folded forward and, with --breakdown-modes, the dense one eager (``dense``) and
under Inductor (``dense_compiled``) and the ablations (``specfold_no_inductor``, ``specfold_graph_flags``)."""

from __future__ import annotations

import json

import torch

from specfold_compile.backend import collect_stats, fold_launched_calls, specfold_backend

from ..common import out_dir
from ._context import TAU, BenchContext, tuning


def kernel_group(name: str) -> str:
    """Which part of the forward a CUDA kernel belongs to, from its name."""
    key = name.lower()
    if "fold_flag" in key:
        return "gate"
    if "resolve" in key:
        return "origin+compaction"
    if "prefix_attn" in key:
        return "attention_prefix"
    if "block_attn" in key:
        return "attention_block_merge"
    if "_packed_linear_body" in key:  # the spill GEMM (Inductor names kernels after their inputs too)
        return "packed_linear_spill"
    if "silu_mul" in key:
        return "packed_swiglu"
    if "index" in key or "gather" in key or "scatter" in key:
        return "packing_gather_scatter"
    if "gemm" in key or "matmul" in key or "cutlass" in key or "sm90" in key or "nvjet" in key:
        return "dense_gemm"
    return "rest(elementwise,norms)"


def _callables(args, ctx: BenchContext, model) -> dict:
    """One compiled callable per mode, reused across N (N is marked dynamic: no recompile)."""
    fns = {}
    for mode in args.breakdown_modes:
        if mode == "dense":
            fns[mode] = model.verify
        elif mode == "dense_compiled":
            fns[mode] = torch.compile(model.verify, dynamic=True)
        else:
            options = {"tau": TAU, "kernels": ctx.kernels,
                       "tuning": tuning(args, "dense_fraction", "min_spill_us", "combo_kernels"),
                       **({"inductor": False} if mode == "specfold_no_inductor" else {}),
                       **({"gate_flags": "graph"} if mode == "specfold_graph_flags" else {})}
            fns[mode] = torch.compile(model, backend=specfold_backend, options=options)
    return fns


def run(args, ctx: BenchContext) -> list[dict]:
    if ctx.device != "cuda":
        print("this suite measures CUDA memory/kernels: skipped in --cpu-dry-run", flush=True)
        return []
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for name in args.models or ("fast-dllm-v2-1.5b", "fast-dllm-v2-7b"):
        torch._dynamo.reset()
        model = ctx.model(args, name)
        cache = ctx.prefix(model, 512, 1)
        fns = _callables(args, ctx, model)
        for n_rows, mode in [(n, m) for n in (args.ns or (17,)) for m in args.breakdown_modes]:
            tokens, parents = ctx.inputs(model, n_rows, 6, n_rows, cache)
            fn = fns[mode]
            with torch.no_grad(), fold_launched_calls():  # folded where a CUDA-graph capture folds
                with collect_stats() as s:
                    ctx.first_call(lambda: fn(tokens, parents, cache))
                for _ in range(3):
                    fn(tokens, parents, cache)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        fn(tokens, parents, cache)
                    torch.cuda.synchronize()
            tag = f"{name}_{mode}_n{n_rows}"
            (out_dir() / f"breakdown_kernels_{tag}.txt").write_text(  # every kernel, for finer reading
                prof.key_averages().table(sort_by="cuda_time_total", row_limit=60, max_name_column_width=90))
            groups: dict[str, list] = {}
            for evt in prof.key_averages():
                us = evt.device_time_total if hasattr(evt, "device_time_total") else evt.cuda_time_total
                if us <= 0:
                    continue
                group = groups.setdefault(kernel_group(evt.key), [0.0, 0])
                group[0] += us / 5 / 1e3
                group[1] += evt.count / 5
            total = sum(ms for ms, _ in groups.values())
            for group, (ms, launches) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
                rows.append({"model": name, "mode": mode, "n_branches": n_rows, "prefix": 512,
                             "recompute_ratio": s.recompute_ratio if s.layers else 1.0, "part": group,
                             "ms_per_forward": ms, "ms_per_layer": ms / model.config.num_layers, "share": ms / total,
                             "kernels_per_forward": launches})
                print(json.dumps(rows[-1]), flush=True)
        fn = None  # the last mode's callable holds the model too
        del model, cache, fns
        torch.cuda.empty_cache()
    return rows
