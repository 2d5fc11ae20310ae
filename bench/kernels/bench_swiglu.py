"""Benchmark the packed SwiGLU activation (silu(gate) * up on the halves of a fused gate_up output,
[N * 32, 2 * ffn] bf16) against the same work over every row (what Inductor's fused elementwise kernel
does in the packed MLP), at recompute ratios 0.1875 / 0.5 / 1, with the bandwidth floor of the
computed rows."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

import torch  # noqa: E402

from specfold_compile.kernels.swiglu import silu_mul  # noqa: E402
from specfold_compile.kernels.swiglu_ref import silu_mul_ref  # noqa: E402


def main(argv=None):
    args = C.parse_args(argv, __doc__)
    models, block, _, ns = C.configs(args)
    dev = C.device()
    dt = torch.bfloat16
    rows = []
    all_rows = torch.compile(silu_mul_ref) if dev == "cuda" and not C.interpreting() else silu_mul_ref
    for mname, m in models.items():
        ffn = m["ffn"]
        for N in ns:
            R = N * block
            gate, up = torch.randn(R, 2 * ffn, device=dev).to(dt).split(ffn, dim=-1)
            ms_all = C.bench(lambda: all_rows(gate, up), args.quick)
            for ratio in (0.1875, 0.5, 1.0):
                c = max(1, round(ratio * R))
                count = torch.tensor(c, device=dev)
                out = silu_mul(gate, up, count)
                err = C.rel_err(out[:c], silu_mul_ref(gate.float(), up.float())[:c])
                ms = C.bench(lambda: silu_mul(gate, up, count), args.quick)
                fl = C.floor_ms(3 * c * ffn * 2, 5.0 * c * ffn)
                rows.append(dict(model=mname, N=N, R=R, ffn=ffn, recompute_ratio=ratio, ms=ms, all_rows_ms=ms_all,
                                 **fl, frac_of_floor=fl["floor_ms"] / ms, max_rel_err=err))
    return C.emit("packed_silu_mul", rows, args)


if __name__ == "__main__":
    main()
