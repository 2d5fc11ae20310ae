"""Benchmark fold_gate (flags + origin resolution + compaction) at the residual-stream shapes
(bf16 h [N, 32, hidden]), with the bandwidth floor and the mismatch against the reference; the resolve
launch both ways (its pointer jumping in registers, the default up to ``gate.REGISTER_TILE_MAX``, and
through global memory), and the flag launch alone (``flags_ms``).

``--flag-sweep``: the flag launch at every (BLOCK_ROWS, BLOCK_C, num_warps) of a grid against the default
(``gate.flag_config``), each checked against the reference's fold mask; prints one ``flag_sweep`` line
per point with the best config.

``--serving``: one gate of the serving engine's replayed SpecFold forward (``serving.capacity_gates``) over
the rows of several requests of N branches each (``--ns``, default 17), 1 to 64 requests (``--requests``)
padded as the engine pads them. The whole gate (its tensor-op flags, the padding folded, the resolution
and packing, the overflow flag and the slots' clamp) with the resolve kernel (``kernel_ms``, at every
size: ``engine_takes_kernel`` says whether the engine would take it) and with tensor ops
(``tensor_ops_ms``); its fold test alone (``reference.fold_test``: ``flags_ms`` launched eagerly,
``flags_compiled_ms`` compiled by Inductor as the engine runs it under ``compile_layers``, on CUDA only)
and the kernel's flag launch on the same rows (``flags_kernel_ms``): what a gate costs a forward, by
rows, and what is left to fuse. The two paths' outputs are checked equal (``mismatches``)."""
from __future__ import annotations

from bench.kernels import _common as C  # first: sets TRITON_INTERPRET on CPU before the kernels import

from unittest import mock

import torch
import triton

from specfold_compile.kernels import gate
from specfold_compile.kernels.gate import fold_gate, resolve_folds
from specfold_compile.kernels.gate_ref import fold_gate_ref, fold_test, resolve_folds_ref


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


FLAG_SWEEP = [(rows, chunk, warps) for rows in (1, 2, 4, 8) for chunk in (512, 1024, 2048, 4096)
              for warps in (1, 2, 4, 8)]
FLAG_SWEEP_QUICK = [(1, 8, 1), (4, 16, 2)]


def flag_sweep(args, models, block, ns) -> list[dict]:
    """Every config of FLAG_SWEEP (chunks up to twice the row) at each model's width and N."""
    dev, gen, tau, rows = C.device(), torch.Generator().manual_seed(0), torch.tensor(0.1, device=C.device()), []
    for mname, m in models.items():
        for N in ns:
            h, parents = make_problem(N, block, m["hidden"], 0.1, dev, torch.bfloat16, gen)
            ref = fold_gate_ref(h, parents, tau)[0]
            default = gate.flag_config(m["hidden"])
            grid = FLAG_SWEEP_QUICK if args.quick else [
                c for c in FLAG_SWEEP if c[1] <= 2 * triton.next_power_of_2(m["hidden"]) and c[0] * c[1] <= 16384]
            point = []
            for cfg in dict.fromkeys(grid + [default]):
                with mock.patch.object(gate, "flag_config", lambda _c, cfg=cfg: cfg):
                    mism = int((gate._fold_flags(h, parents, tau) != ref).sum())
                    ms = C.bench(lambda: gate._fold_flags(h, parents, tau), args.quick)
                point.append(dict(model=mname, N=N, B=block, C=m["hidden"], config=list(cfg), default=cfg == default,
                                  ms=ms, mismatches=mism))
            best = min(point, key=lambda r: r["ms"])
            ms_default = next(r["ms"] for r in point if r["default"])
            print(f"flag_sweep {mname} N={N} best={tuple(best['config'])} {best['ms'] * 1e3:.2f} us "
                  f"default={default} {ms_default * 1e3:.2f} us", flush=True)
            rows += point
    return rows


def serving_gates(args, models, block, ns) -> list[dict]:
    """``--serving``: CapacityGates over padded batches of requests, both resolve paths (module docstring)."""
    from specfold_compile.serving import capacity_gates
    from specfold_compile.serving.capacity_gates import CapacityGates
    from specfold_compile.serving.graphs import row_bucket

    dev, gen, rows = C.device(), torch.Generator().manual_seed(0), []
    compiled_test = torch.compile(fold_test, dynamic=True)  # (compiles on its first call, before timing)
    tau = torch.tensor(0.1, device=dev)
    n = ns[0] if args.ns else (2 if args.quick else 17)
    for mname, m in models.items():
        for q in ([1, 2] if args.quick else [int(x) for x in args.requests.split(",")]):
            streams = [make_problem(n, block, m["hidden"], 0.1, dev, torch.bfloat16, gen) for _ in range(q)]
            r_pad = row_bucket(q * n)
            h = torch.cat([s[0] for s in streams] + [streams[0][0][:1].expand(r_pad - q * n, -1, -1)])
            parents = torch.cat([torch.where(s[1] >= 0, s[1] + i * n, -1) for i, s in enumerate(streams)]
                                + [torch.zeros(r_pad - q * n, dtype=torch.long, device=dev)])
            pad_rows = torch.arange(r_pad, device=dev) >= q * n
            capacity = (r_pad * block,)
            with mock.patch.object(capacity_gates, "KERNEL_TILE_MAX", 1 << 40):  # the kernel past its bound too
                gates = {path: CapacityGates(parents, block, n - 1, tau, capacity, pad_rows, None, path == "kernel")
                         for path in ("kernel", "tensor_ops")}

            def call(path):
                gates[path].masks.clear()  # one gate, again: every call takes the first capacity
                return gates[path](h)

            outs = {path: call(path) + (gates[path].masks[0],) for path in gates}
            parent = gates["kernel"].parent
            mism = sum(int((a != b).sum()) for a, b in zip(outs["kernel"], outs["tensor_ops"]))
            rows.append(dict(model=mname, requests=q, N=n, rows=r_pad, B=block, C=m["hidden"],
                             engine_takes_kernel=r_pad * block <= capacity_gates.KERNEL_TILE_MAX, mismatches=mism,
                             kernel_ms=C.bench(lambda: call("kernel"), args.quick),
                             tensor_ops_ms=C.bench(lambda: call("tensor_ops"), args.quick),
                             flags_ms=C.bench(lambda: fold_test(h, parent, tau), args.quick),
                             flags_compiled_ms=C.bench(lambda: compiled_test(h, parent, tau), args.quick)
                             if torch.device(dev).type == "cuda" else None,
                             flags_kernel_ms=C.bench(lambda: gate._fold_flags(h, parents, tau), args.quick)))
    return rows


def _extra(ap):
    ap.add_argument("--flag-sweep", action="store_true")
    ap.add_argument("--serving", action="store_true")
    ap.add_argument("--requests", default="1,4,8,15,16,30,64",
                    help="--serving: requests a batch, comma-separated (15 requests of 17 rows: 255, under the "
                         "kernel's bound; 16: 272, padded to 384, over it)")


def main(argv=None):
    args = C.parse_args(argv, __doc__, extra=_extra)
    models, block, _, ns = C.configs(args)
    if args.flag_sweep:
        return C.emit("fold_flags_sweep", flag_sweep(args, models, block, ns), args)
    if args.serving:
        return C.emit("serving_gates", serving_gates(args, models, block, ns), args)
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
            ms_flags = C.bench(lambda: gate._fold_flags(h, parents, tau), args.quick)
            with mock.patch.object(gate, "REGISTER_TILE_MAX", 0):  # the rounds through global memory
                global_out = resolve_folds(out[0], parents)
                mism += sum(int((a != b).sum()) for a, b in zip(global_out, ref[1:]))
                ms_resolve_global = C.bench(lambda: resolve_folds(out[0], parents), args.quick)
            fl = C.floor_ms(h.numel() * 2 + N * block * (1 + 8 * 3), 3.0 * h.numel())
            rows.append(dict(model=mname, N=N, B=block, C=m["hidden"], ms=ms, resolve_ms=ms_resolve, flags_ms=ms_flags,
                             resolve_global_ms=ms_resolve_global,
                             **fl, frac_of_floor=fl["floor_ms"] / ms, mismatches=mism,
                             max_rel_err=float(mism), recompute=float(out[3]) / (N * block)))
    return C.emit("fold_gate", rows, args)


if __name__ == "__main__":
    main()
