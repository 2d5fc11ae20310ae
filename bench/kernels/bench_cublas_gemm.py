"""cuBLAS bf16 GEMM time at the decoder's weight shapes and few rows (what a verification forward's
linears cost), weights cold in L2: each timing cycles through enough copies of the weight (>= 400 MB) that
none is still cached, as in a forward, where every weight is read once.

    PYTHONPATH=. python bench/kernels/bench_cublas_gemm.py --out bench/results/h200/bench_cublas_gemm.json

Rows: {"model", "weight", "M" (rows), "out", "in", "us", "GBps" (weight bytes / time), "TFLOPs"}.
"""
from __future__ import annotations

import argparse
import json

import torch

from specfold_compile.models.config import preset

MODELS = ("fast-dllm-v2-1.5b", "fast-dllm-v2-7b")
ROWS = (32, 64, 96, 128, 160, 256, 544)


def weight_shapes(cfg) -> dict[str, tuple[int, int]]:
    """(out, in) of each linear of a layer, unfused and fused, and of the LM head."""
    c, hd, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    return {"q": (cfg.num_heads * hd, c), "kv": (cfg.num_kv_heads * hd, c), "o": (c, cfg.num_heads * hd),
            "gate": (f, c), "down": (c, f), "qkv": ((cfg.num_heads + 2 * cfg.num_kv_heads) * hd, c),
            "gate_up": (2 * f, c), "lm_head": (cfg.vocab_size, c)}


def cold_weights(m: int, k: int) -> list[torch.Tensor]:
    """Enough bf16 [m, k] copies (>= 400 MB, 2-40 of them) that a pass over them leaves none in L2."""
    copies = min(40, max(2, int(400e6 // (m * k * 2)) + 1))
    return [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]


def time_mm(x: torch.Tensor, weights: list[torch.Tensor], y: torch.Tensor) -> float:
    """Median microseconds of one torch.mm, from CUDA-graph replays of a pass over every weight copy."""
    def one_pass():
        for w in weights:
            torch.mm(x, w.t(), out=y)

    return time_pass(one_pass, len(weights))


def time_pass(one_pass, calls: int) -> float:
    """Median microseconds per call of ``one_pass`` (``calls`` GEMMs), from CUDA-graph replays."""
    for _ in range(3):
        one_pass()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        one_pass()
    return 1e3 * replay_median_ms(graph, 10) / calls


def replay_median_ms(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """Median milliseconds of one replay of a captured CUDA graph, over ``replays`` event-timed replays."""
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def gpu_args(name: str, doc: str, flags: tuple[str, ...] = ()) -> argparse.Namespace:
    """The cuBLAS benchmarks' options (--out, --models, and on/off ``flags``); stops with a message naming
    ``name`` without CUDA."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", default=f"{name}.json")
    ap.add_argument("--models", type=lambda v: tuple(v.split(",")), default=MODELS)
    for flag in flags:
        ap.add_argument(flag, action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(f"{name}: needs a CUDA GPU (it times cuBLAS)")
    return args


def main() -> None:
    args = gpu_args("bench_cublas_gemm", __doc__)
    rows = []
    for name in args.models:
        for wname, (m, k) in weight_shapes(preset(name)).items():
            weights = cold_weights(m, k)
            for n_rows in ROWS:
                x = torch.randn(n_rows, k, device="cuda", dtype=torch.bfloat16)
                y = torch.empty(n_rows, m, device="cuda", dtype=torch.bfloat16)
                us = time_mm(x, weights, y)
                rows.append({"model": name, "weight": wname, "M": n_rows, "out": m, "in": k, "us": round(us, 2),
                             "GBps": round(m * k * 2 / us / 1e3, 1), "TFLOPs": round(2 * n_rows * m * k / us / 1e6, 1)})
                print(json.dumps(rows[-1]), flush=True)
            del weights
    with open(args.out, "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
