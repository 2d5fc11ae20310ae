"""GEMMs over the first ``count`` rows of a packed batch, ``count`` on the device: the packed linears'
fixed cuBLAS head + count-aware spill (what the backend runs) against ``torch._grouped_mm`` with one
group whose end is ``count`` (CUTLASS on Hopper: row tiles past the count do no work, in one launch, each
weight read once), one decoder layer's packed linears (qkv, gate_up, down), weights cold in L2.

    PYTHONPATH=. python bench/kernels/bench_count_gemm.py --models fast-dllm-v2-1.5b,fast-dllm-v2-7b,nld-3b \
        --out bench/results/h200/session11/call2/bench_count_gemm.json

Rows: {"model", "rows" (R = N * 32), "count", "variant", "us" (per layer, CUDA-graph replays), "err"
(relative error of the computed rows against fp32)}. Also probes whether this torch can capture CUDA-graph
conditional nodes (``torch.cuda.CUDAGraph.begin_capture_to_if_node``).
"""
from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cublas_gemm import gpu_args, replay_median_ms, weight_shapes  # noqa: E402

from specfold_compile.models.config import preset  # noqa: E402

POINTS = {288: (32, 64, 128, 200), 544: (32, 100, 128, 160, 200, 256, 300, 400, 544), 1056: (100, 200, 300, 600)}


def layer_shapes(cfg) -> list[tuple[int, int]]:
    """(out, in) of the packed linears of one layer, fused as the models run them."""
    shapes = weight_shapes(cfg)
    return [shapes["qkv"], shapes["gate_up"], shapes["down"]]


def time_graph(fn, replays: int = 20) -> float:
    """Median ms of one replay of a CUDA graph of ``fn`` (after a warm-up call outside capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    return replay_median_ms(graph, replays)


def main() -> None:
    args = gpu_args("bench_count_gemm", __doc__)
    from specfold_compile import fold_ops

    probe = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(),
             "conditional_nodes": hasattr(torch.cuda.CUDAGraph, "begin_capture_to_if_node"),
             "grouped_mm": hasattr(torch, "_grouped_mm")}
    print(json.dumps(probe), flush=True)
    rows = [probe]
    for name in args.models:
        shapes = layer_shapes(preset(name))
        copies = max(2, int(600e6 // sum(m * k * 2 for m, k in shapes)) + 1)
        layers = [[torch.randn(m, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for m, k in shapes]
                  for _ in range(copies)]
        layers_kn = [[w.t().contiguous().unsqueeze(0) for w in ws] for ws in layers]
        for R, counts in POINTS.items():
            xs = [torch.randn(R, k, device="cuda", dtype=torch.bfloat16) for m, k in shapes]
            count = torch.zeros((), device="cuda", dtype=torch.int64)
            offs = torch.zeros(1, device="cuda", dtype=torch.int32)
            outs = {}

            def fixed_head():
                for ws in layers:
                    for i, (x, w) in enumerate(zip(xs, ws)):
                        outs[i] = fold_ops.packed_linear(x, w, None, count, 0.45, "triton", 2.0)

            def grouped(kn: bool, cast: bool):
                def run():
                    if cast:  # the backend's count is int64; _grouped_mm takes int32 group ends
                        offs.copy_(count.view(1))
                    for ws, wkn in zip(layers, layers_kn):
                        for i, (x, w, wt) in enumerate(zip(xs, ws, wkn)):
                            outs[i] = torch._grouped_mm(x, wt if kn else w.t().unsqueeze(0), offs=offs)
                return run

            def mm_rows(c):
                def run():
                    for ws in layers:
                        for i, (x, w) in enumerate(zip(xs, ws)):
                            outs[i] = torch.mm(x[:c], w.t())
                return run

            for c in counts:
                count.fill_(c)
                offs.fill_(c)
                variants = {"fixed_head_spill": fixed_head, "mm_exact_rows": mm_rows(c),
                            "grouped_mm": grouped(False, False), "grouped_mm_cast": grouped(False, True),
                            "grouped_mm_kn": grouped(True, False)}
                for vname, fn in variants.items():
                    row = {"model": name, "rows": R, "count": c, "variant": vname}
                    try:
                        ms = time_graph(fn)
                        errs = []
                        for i, w in enumerate(layers[-1]):
                            want = xs[i][:c].float() @ w.float().t()
                            got = outs[i][:c].float()
                            errs.append(float((got - want).norm() / want.norm()) if torch.isfinite(got).all()
                                        else float("inf"))
                        row.update(us=round(1e3 * ms / len(layers), 2), err=max(errs))
                    except Exception as exc:  # a probe: report and go on
                        row["error"] = repr(exc)[:300]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        del layers, layers_kn
        torch.cuda.empty_cache()
    with open(args.out, "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
