"""Does cuBLAS pick faster kernels for the packed linears' GEMMs with another call? At the decoder's
fused weight shapes and the cuBLAS head's row counts, weights cold in L2 (as bench_cublas_gemm.py):
``mm`` = torch.mm(x, w.t()) as the backend calls it, ``slice`` = the same on the leading rows of a
272-row buffer (as a packed linear's head), ``nn`` = the weight stored transposed ([in, out],
contiguous); each with cuBLAS and with cuBLASLt (torch.backends.cuda.preferred_blas_library).

    PYTHONPATH=. python bench/kernels/bench_cublas_variants.py --out bench/results/h200/gemm_probe.json

Rows: {"model", "weight", "M", "<variant>_<library>": microseconds per GEMM, ...}.
"""
from __future__ import annotations

import json

import torch

from bench.kernels.bench_cublas_gemm import cold_weights, gpu_args, time_pass, weight_shapes

from specfold_compile.models.config import preset

WEIGHTS = ("qkv", "o", "gate_up", "down")
ROWS = (64, 96, 128, 192, 256)


def main() -> None:
    args = gpu_args("bench_cublas_variants", __doc__)
    rows = []
    for name in args.models:
        for wname, (m, k) in weight_shapes(preset(name)).items():
            if wname not in WEIGHTS:
                continue
            ws = cold_weights(m, k)
            copies = len(ws)
            wts = [w.t().contiguous() for w in ws]
            for n_rows in ROWS:
                xb = torch.randn(max(272, n_rows), k, device="cuda", dtype=torch.bfloat16)
                yb = torch.empty(xb.shape[0], m, device="cuda", dtype=torch.bfloat16)
                x, y = xb[:n_rows].clone(), yb[:n_rows].clone()
                row = {"model": name, "weight": wname, "M": n_rows}
                for lib in ("cublas", "cublaslt"):
                    torch.backends.cuda.preferred_blas_library(lib)
                    row[f"mm_{lib}"] = round(time_pass(lambda: [torch.mm(x, w.t(), out=y) for w in ws], copies), 2)
                    row[f"slice_{lib}"] = round(time_pass(
                        lambda: [torch.mm(xb[:n_rows], w.t(), out=yb[:n_rows]) for w in ws], copies), 2)
                    row[f"nn_{lib}"] = round(time_pass(lambda: [torch.mm(x, wt, out=y) for wt in wts], copies), 2)
                torch.backends.cuda.preferred_blas_library("cublas")
                rows.append(row)
                print(json.dumps(row), flush=True)
            del ws, wts
    with open(args.out, "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
