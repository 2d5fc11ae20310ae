"""Benchmark packed_linear at the Fast-dLLM-v2 projection shapes (bf16), with the floor and the
worst relative error against the float32 reference.

Two things are timed per (layer, N, computed fraction):
  - ``ms``: the count-aware Triton GEMM alone on all rows (tiles past the count exit at once);
  - ``op_ms``: ``specfold::packed_linear`` as the backend calls it (cuBLAS on the first
    ``dense_rows(R, dense_fraction)`` rows, the rest spilled to the Triton GEMM), next to
    ``dense_ms``, cuBLAS on all R rows (what dense verification runs).
The summary rows (``layer="all"``) add up one decoder layer's linears: ``packed_over_dense`` for
qkv + gate_up + down (the packed position-wise layers) and ``layer_over_dense`` with the o_proj, which
runs on every row (folded rows' attention output differs from their origin's).
"""
from __future__ import annotations

from bench.kernels import _common as C  # first: sets TRITON_INTERPRET on CPU before the kernels import

import torch

from specfold_compile.ops import fold_ops
from specfold_compile.backend.settings import Tuning
from specfold_compile.ops.device_profile import H200
from specfold_compile.kernels.packed_linear import packed_linear
from specfold_compile.kernels.packed_linear_ref import packed_linear_ref


def layers(m):
    h, d = m["hidden"], m["d"]
    return {
        "qkv": (h, (m["hq"] + 2 * m["hkv"]) * d, True),
        "o_proj": (m["hq"] * d, h, False),
        "gate_up": (h, 2 * m["ffn"], False),
        "down": (m["ffn"], h, False),
    }


FRACTIONS = (1.0, 0.44, 0.25)
DENSE_FRACTION = Tuning().dense_fraction  # the backend's default


def summarize(rows: list[dict]) -> list[dict]:
    """One decoder layer's linears per (model, N, fraction): packed vs dense time."""
    out = []
    keys = sorted({(r["model"], r["N"], r["frac"]) for r in rows})
    for model, n, frac in keys:
        part = {r["layer"]: r for r in rows if (r["model"], r["N"], r["frac"]) == (model, n, frac)}
        packed = [part[k] for k in ("qkv", "gate_up", "down") if k in part]
        if len(packed) != 3 or "o_proj" not in part:
            continue
        op = sum(r["op_ms"] for r in packed)
        dense = sum(r["dense_ms"] for r in packed)
        o = part["o_proj"]["dense_ms"]
        out.append(dict(model=model, layer="all", N=n, frac=frac, op_ms=op, dense_ms=dense,
                        packed_over_dense=op / dense, layer_over_dense=(op + o) / (dense + o)))
    return out


def main(argv=None):
    args = C.parse_args(argv, __doc__)
    models, block, _, ns = C.configs(args)
    dev = C.device()
    dt = torch.bfloat16
    rows = []
    for mname, m in models.items():
        for lname, (K, M, has_bias) in layers(m).items():
            w = (torch.randn(M, K, device=dev) * K ** -0.5).to(dt)
            b = torch.randn(M, device=dev).to(dt) if has_bias else None
            for N in ns:
                R = N * block
                x = torch.randn(R, K, device=dev).to(dt)
                # the same for every fraction: the fp32 reference and cuBLAS on all rows (dense verification)
                ref = packed_linear_ref(x.float(), w.float(), None if b is None else b.float())
                dense_ms = C.bench(lambda: torch.nn.functional.linear(x, w, b), args.quick)
                for frac in FRACTIONS:
                    c = max(1, int(R * frac))
                    count = torch.tensor(c, dtype=torch.int64, device=dev)
                    y = packed_linear(x, w, b, count, min_block_r=H200.packed_linear_min_block_r)
                    err = C.rel_err(y[:c], ref[:c])
                    ms = C.bench(lambda: packed_linear(x, w, b, count, min_block_r=H200.packed_linear_min_block_r), args.quick)
                    fl = C.floor_ms(M * K * 2 + c * K * 2 + c * M * 2, 2.0 * c * M * K)
                    torch_ms = C.bench(lambda: torch.nn.functional.linear(x[:c], w, b), args.quick)
                    y_op = fold_ops.packed_linear(x, w, b, count, DENSE_FRACTION, "triton")
                    op_err = C.rel_err(y_op[:c], ref[:c])
                    op_ms = C.bench(lambda: fold_ops.packed_linear(x, w, b, count, DENSE_FRACTION, "triton"),
                                    args.quick)
                    rows.append(dict(model=mname, layer=lname, N=N, rows=R, count=c, frac=frac, K=K, M=M, ms=ms,
                                     torch_linear_ms=torch_ms, **fl, frac_of_floor=fl["floor_ms"] / ms,
                                     max_rel_err=err, op_ms=op_ms, op_max_rel_err=op_err, dense_ms=dense_ms,
                                     op_over_dense=op_ms / dense_ms,
                                     head_rows=fold_ops.dense_rows(R, DENSE_FRACTION), dense_fraction=DENSE_FRACTION))
    return C.emit("packed_linear", rows + summarize(rows), args)


if __name__ == "__main__":
    main()
