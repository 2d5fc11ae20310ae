"""Benchmark folded ragged attention (``kernels.folded_ragged_attention``: each computed position's prefix
walked once, every position's block merged through the origin map; two launches) against dense ragged
attention (``kernels.ragged_attention``: every position's q, k, v, each walking its request's prefix; one
launch, two where it splits the prefix) on the same folded batch, at the Fast-dLLM-v2 attention shapes
(bf16, blocks of 32): prefixes 512 / 2048, 17 branches a request, 1 / 4 / 16 / 64 requests, recompute ratios
0.2 / 0.5 (the share of the draft rows' positions computed; every main row is).

The dense path is timed on q, k, v already expanded to every position, as the engine's compiled qkv piece
writes them. ``*_ms``: median device time of CUDA-graph replays; ``*_first_call_ms``: the first call (the
Triton compile of a new launch configuration, and the run). ``max_rel_err``: folded against dense; with
``--quick`` also ``ref_max_rel_err``, against the float32 twin (``folded_ragged_attention_ref``).
"""
from __future__ import annotations

import math

from bench.kernels import _common as C  # first: sets TRITON_INTERPRET on CPU before the kernels import

import torch

from bench.kernels.bench_ragged_attention import first_call_ms
from specfold_compile.kernels import (folded_ragged_attention, folded_ragged_attention_ref, ragged_attention,
                                      resolve_folds_ref)
from specfold_compile.ops.device_profile import H200

PREFIXES = [512, 2048]
BRANCHES = [17]
REQUESTS = [1, 4, 16, 64]
RATIOS = [0.2, 0.5]


def extra_args(ap):
    ap.add_argument("--requests", default=None, help="comma-separated request counts (default: 1,4,16,64)")
    ap.add_argument("--ratios", default=None, help="comma-separated recompute ratios of the draft rows "
                                                   "(default: 0.2,0.5)")


def packing(n_req: int, N: int, block: int, ratio: float, gen):
    """n_req requests of N rows (a chain of drafts: each draft's parent the row before), every draft position
    folded with probability 1 - ratio: (rows, slot) of the resolved packing, and the computed count."""
    parents = torch.tensor([-1 if n % N == 0 else n - 1 for n in range(n_req * N)])
    fold = (torch.rand(n_req * N, block, generator=gen) >= ratio) & (parents >= 0)[:, None]
    _, rows, count, slot = resolve_folds_ref(fold, parents)
    return rows[:int(count)], slot, int(count)


def main(argv=None):
    args = C.parse_args(argv, __doc__, extra=extra_args)
    models, block, prefixes, ns = C.configs(args)
    if args.quick:
        requests, ratios = [1, 3], [0.5]
    else:
        prefixes = [int(p) for p in args.prefixes.split(",")] if args.prefixes else PREFIXES
        ns = [int(n) for n in args.ns.split(",")] if args.ns else BRANCHES
        requests = [int(r) for r in args.requests.split(",")] if args.requests else REQUESTS
        ratios = [float(r) for r in args.ratios.split(",")] if args.ratios else RATIOS
    dev, dt = C.device(), torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    rows_out = []
    for mname, m in models.items():
        scale = 1.0 / math.sqrt(m["d"])
        for P, N, n_req, ratio in ((P, N, r, x) for P in prefixes for N in ns for r in requests for x in ratios):
            rows, slot, count = packing(n_req, N, block, ratio, gen)
            q_p = torch.randn(count, m["hq"], m["d"], generator=gen).to(dev, dt)
            k_p = torch.randn(count, m["hkv"], m["d"], generator=gen).to(dev, dt)
            v_p = torch.randn(count, m["hkv"], m["d"], generator=gen).to(dev, dt)
            k_pool = torch.randn(n_req + 1, m["hkv"], P, m["d"], generator=gen).to(dev, dt)
            v_pool = torch.randn(n_req + 1, m["hkv"], P, m["d"], generator=gen).to(dev, dt)
            idx = dict(dtype=torch.int32, device=dev)
            pool_args = (k_pool, v_pool, torch.tensor([N * i for i in range(n_req + 1)], **idx),
                         torch.tensor(list(range(n_req, 0, -1)), **idx), torch.tensor([P] * n_req, **idx))
            rows, slot = rows.to(dev), slot.to(dev)
            q, k, v = q_p[slot], k_p[slot], v_p[slot]  # every position's, as the dense path reads them

            def folded():
                return folded_ragged_attention(q_p, k_p, v_p, rows, slot, *pool_args, scale, tuning=H200.attention)

            def dense():
                return ragged_attention(q, k, v, *pool_args, scale, tuning=H200.attention)

            folded_first, dense_first = first_call_ms(folded), first_call_ms(dense)
            out = folded()
            row = dict(model=mname, P=P, N=N, requests=n_req, positions=n_req * N * block, computed=count,
                       recompute_ratio=ratio, folded_first_call_ms=folded_first, dense_first_call_ms=dense_first,
                       folded_ms=C.bench(folded, args.quick), dense_ms=C.bench(dense, args.quick),
                       max_rel_err=C.rel_err(out.float(), dense().float()))
            row["speedup"] = row["dense_ms"] / row["folded_ms"]
            if args.quick:
                ref = folded_ragged_attention_ref(q_p, k_p, v_p, rows, slot, *pool_args, scale)
                row["ref_max_rel_err"] = C.rel_err(out.float(), ref.float())
            print(f"folded ragged {mname} P={P} N={N} requests={n_req} ratio={ratio}: {count} of "
                  f"{n_req * N * block} positions computed; folded {row['folded_ms'] * 1e3:.1f} us vs dense "
                  f"{row['dense_ms'] * 1e3:.1f} us (graph)", flush=True)
            rows_out.append(row)
    return C.emit("folded_ragged_attention", rows_out, args)


if __name__ == "__main__":
    main()
