"""Benchmark fold_gate (flags + origin resolution + compaction) at the residual-stream shapes
(bf16 h [N, 32, hidden]), with the bandwidth floor and the mismatch against the reference; the resolve
launch both ways (its pointer jumping in registers, the default up to ``gate.REGISTER_TILE_MAX``, and
through global memory)."""
from __future__ import annotations

from bench.kernels import _common as C  # first: sets TRITON_INTERPRET on CPU before the kernels import

from unittest import mock

import torch

from specfold_compile.kernels import gate
from specfold_compile.kernels.gate import fold_gate, resolve_folds
from specfold_compile.kernels.gate_ref import fold_gate_ref, resolve_folds_ref


def make_problem(N, B, Cdim, tau, dev, dt, gen):
    """Residuals whose gate ratios are 0.3*tau (fold) or 3*tau (keep): decisions far from the
    threshold, so the kernel and the reference must agree exactly."""
    par = [-1] + [int(torch.randint(0, n, (1,), generator=gen)) for n in range(1, N)]
    h = torch.empty(N, B, Cdim)
    h[0] = torch.randn(B, Cdim, generator=gen)
    for n in range(1, N):
        hp = h[par[n]]
        u = torch.randn(B, Cdim, generator=gen)
        u = u / u.norm(dim=-1, keepdim=True)
        r = torch.where(torch.rand(B, 1, generator=gen) < 0.7, 0.3 * tau, 3 * tau)
        h[n] = hp + r * hp.norm(dim=-1, keepdim=True) * u
    return h.to(dev, dt), torch.tensor(par, device=dev)


def main(argv=None):
    args = C.parse_args(argv, __doc__)
    models, block, _, ns = C.configs(args)
    dev = C.device()
    dt = torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    rows = []
    tau = torch.tensor(0.1, device=dev)
    for mname, m in models.items():
        for N in ns:
            h, parents = make_problem(N, block, m["hidden"], 0.1, dev, dt, gen)
            out = fold_gate(h, parents, tau)
            ref = fold_gate_ref(h, parents, tau)
            mism = sum(int((a != b).sum()) for a, b in zip(out, ref))
            ms = C.bench(lambda: fold_gate(h, parents, tau), args.quick)
            ms_resolve = C.bench(lambda: resolve_folds(out[0], parents), args.quick)
            with mock.patch.object(gate, "REGISTER_TILE_MAX", 0):  # the rounds through global memory
                global_out = resolve_folds(out[0], parents)
                mism += sum(int((a != b).sum()) for a, b in zip(global_out, ref[1:]))
                ms_resolve_global = C.bench(lambda: resolve_folds(out[0], parents), args.quick)
            fl = C.floor_ms(h.numel() * 2 + N * block * (1 + 8 * 3), 3.0 * h.numel())
            rows.append(dict(model=mname, N=N, B=block, C=m["hidden"], ms=ms, resolve_ms=ms_resolve,
                             resolve_global_ms=ms_resolve_global,
                             **fl, frac_of_floor=fl["floor_ms"] / ms, mismatches=mism,
                             max_rel_err=float(mism), recompute=float(out[3]) / (N * block)))
    return C.emit("fold_gate", rows, args)


if __name__ == "__main__":
    main()
