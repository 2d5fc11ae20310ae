"""Benchmark the packed SwiGLU activation (silu(gate) * up on the halves of a fused gate_up output,
[N * 32, 2 * ffn] bf16) against the same work over every row (what Inductor's fused elementwise kernel
does in the packed MLP), at recompute ratios 0.1875 / 0.5 / 1, with the bandwidth floor of the
computed rows.

``--sweep``: the kernel at every (BLOCK_R, BLOCK_F, num_warps) of a grid, at N = 17 and recompute
ratios 0.1875 and 1, against the default config (``SILU_MUL_CONFIG``); prints one ``silu_sweep`` line
per point with the best config.
"""
from __future__ import annotations

from bench.kernels import _common as C  # first: sets TRITON_INTERPRET on CPU before the kernels import

import torch

from specfold_compile.kernels.swiglu import SILU_MUL_CONFIG, silu_mul
from specfold_compile.kernels.swiglu_ref import silu_mul_ref


SWEEP = [(br, bf, w) for br in (4, 8, 16, 32) for bf in (256, 512, 1024, 2048) for w in (4, 8)]
SWEEP_QUICK = [(1, 16, 4), (4, 32, 4)]


def sweep(args, models, block) -> list[dict]:
    """Every config of SWEEP at N = 17 (the quick run: its own Ns and two tiny configs)."""
    dev, dt, rows = C.device(), torch.bfloat16, []
    ns = [3] if args.quick else [17]
    for mname, m in models.items():
        ffn = m["ffn"]
        for N in ns:
            R = N * block
            gate, up = torch.randn(R, 2 * ffn, device=dev).to(dt).split(ffn, dim=-1)
            for ratio in (0.1875, 1.0):
                c = max(1, round(ratio * R))
                count = torch.tensor(c, device=dev)
                ref = silu_mul_ref(gate.float(), up.float())[:c]
                fl = C.floor_ms(3 * c * ffn * 2, 5.0 * c * ffn)
                point = []
                for cfg in (SWEEP_QUICK if args.quick else SWEEP):
                    out = silu_mul(gate, up, count, config=cfg)
                    ms = C.bench(lambda: silu_mul(gate, up, count, config=cfg), args.quick)
                    point.append(dict(model=mname, N=N, R=R, ffn=ffn, recompute_ratio=ratio, config=list(cfg),
                                      default=cfg == SILU_MUL_CONFIG, ms=ms, **fl, frac_of_floor=fl["floor_ms"] / ms,
                                      max_rel_err=C.rel_err(out[:c], ref)))
                best = min(point, key=lambda r: r["ms"])
                default = [r["ms"] for r in point if r["default"]]
                print(f"silu_sweep {mname} N={N} r={ratio} best={tuple(best['config'])} {best['ms'] * 1e3:.2f} us "
                      f"default={default[0] * 1e3 if default else float('nan'):.2f} us", flush=True)
                rows += point
    return rows


def main(argv=None):
    args = C.parse_args(argv, __doc__, extra=lambda ap: ap.add_argument("--sweep", action="store_true"))
    models, block, _, ns = C.configs(args)
    if args.sweep:
        return C.emit("packed_silu_mul_sweep", sweep(args, models, block), args)
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
