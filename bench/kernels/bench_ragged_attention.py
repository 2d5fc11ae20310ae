"""Benchmark ragged-prefix branch attention (``kernels.ragged_attention``: one launch over the rows of every
request, each against its own slot of a KV pool) against the serving engine's per-request loop (one
``branch_attention`` per request on views of its slot) at the Fast-dLLM-v2 attention shapes (bf16, blocks
of 32), for prefixes 512 / 2048 / 4096, 5 / 17 branches a request and 1 / 8 / 32 / 64 requests.

Each point's first call of either path is timed apart (``*_first_call_ms``: the Triton compile of a new
launch configuration, and the launch) from its steady state: ``*_ms``, the median device time of CUDA-graph
replays (no Python launch cost), and ``*_eager_ms``, the median of calls launched from Python, as the
engine launches them. ``splits``: the prefix splits the kernel takes (H200 profile), with
``ragged_one_pass_ms`` (one split) beside it when more than one (``--splits S``: S splits instead of the
shape-based choice). ``max_rel_err``: the ragged kernel against the per-request loop; with
``--check-ref`` (or ``--quick``) also ``ref_max_rel_err``, against the float32 twin
(``ragged_attention_ref``).

``--lengths ragged``: request i's prefix is ``P * (i + 1) / n`` keys (1 to P) instead of P for every request.
"""
from __future__ import annotations

import math
import time

from bench.kernels import _common as C  # first: sets TRITON_INTERPRET on CPU before the kernels import

import torch

from specfold_compile.kernels import branch_attention, ragged_attention, ragged_attention_ref
from specfold_compile.kernels.ragged_attention import ragged_splits
from specfold_compile.ops.device_profile import H200

PREFIXES = [512, 2048, 4096]
BRANCHES = [5, 17]
REQUESTS = [1, 8, 32, 64]


def extra_args(ap):
    ap.add_argument("--requests", default=None, help="comma-separated request counts (default: 1,8,32,64)")
    ap.add_argument("--lengths", choices=("equal", "ragged"), default="equal",
                    help="every request's prefix P keys (equal), or 1..P spread over the requests (ragged)")
    ap.add_argument("--check-ref", action="store_true", help="also compare with the float32 reference")
    ap.add_argument("--splits", type=int, default=None,
                    help="the kernel's prefix split count (default: its shape-based choice, ragged_splits)")


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def first_call_ms(fn) -> float:
    """The first call's wall time, synchronised: the compile of a new launch configuration, and the run."""
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return (time.perf_counter() - t0) * 1e3


def problem(m, P, N, n_req, block, lengths_mode, dev, dt, gen):
    """The rows of n_req requests of N branches, a pool of n_req + 1 slots of capacity P (the requests in
    reversed slot order, slot 0 left over), and the index tensors."""
    R = n_req * N
    q = torch.randn(R, block, m["hq"], m["d"], generator=gen).to(dev, dt)
    k = torch.randn(R, block, m["hkv"], m["d"], generator=gen).to(dev, dt)
    v = torch.randn(R, block, m["hkv"], m["d"], generator=gen).to(dev, dt)
    k_pool = torch.randn(n_req + 1, m["hkv"], P, m["d"], generator=gen).to(dev, dt)
    v_pool = torch.randn(n_req + 1, m["hkv"], P, m["d"], generator=gen).to(dev, dt)
    slots = list(range(n_req, 0, -1))
    lengths = [P] * n_req if lengths_mode == "equal" else [max(1, P * (i + 1) // n_req) for i in range(n_req)]
    bounds = [N * i for i in range(n_req + 1)]
    idx = dict(dtype=torch.int32, device=dev)
    dev_args = (torch.tensor(bounds, **idx), torch.tensor(slots, **idx), torch.tensor(lengths, **idx))
    return (q, k, v, k_pool, v_pool), dev_args, (bounds, slots, lengths)


def main(argv=None):
    args = C.parse_args(argv, __doc__, extra=extra_args)
    models, block, prefixes, ns = C.configs(args)
    if args.quick:
        requests = [1, 3]
    else:
        prefixes = [int(p) for p in args.prefixes.split(",")] if args.prefixes else PREFIXES
        ns = [int(n) for n in args.ns.split(",")] if args.ns else BRANCHES
        requests = [int(r) for r in args.requests.split(",")] if args.requests else REQUESTS
    dev, dt = C.device(), torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    rows = []
    for mname, m in models.items():
        scale = 1.0 / math.sqrt(m["d"])
        for P in prefixes:
            for N in ns:
                for n_req in requests:
                    (q, k, v, k_pool, v_pool), dev_args, (bounds, slots, lengths) = problem(
                        m, P, N, n_req, block, args.lengths, dev, dt, gen)

                    def ragged(splits=args.splits):
                        return ragged_attention(q, k, v, k_pool, v_pool, *dev_args, scale, splits=splits,
                                                tuning=H200.attention)

                    def loop():
                        return torch.cat([branch_attention(q[a:e], k[a:e], v[a:e], k_pool[s, :, :L], v_pool[s, :, :L],
                                                           scale, tuning=H200.attention)
                                          for a, e, s, L in zip(bounds, bounds[1:], slots, lengths)])

                    ragged_first, loop_first = first_call_ms(ragged), first_call_ms(loop)
                    out = ragged()
                    row = dict(model=mname, P=P, N=N, requests=n_req, R=n_req * N, lengths=args.lengths,
                               ragged_first_call_ms=ragged_first, loop_first_call_ms=loop_first,
                               ragged_ms=C.bench(ragged, args.quick), loop_ms=C.bench(loop, args.quick),
                               ragged_eager_ms=C.bench(ragged, args.quick, graph=False),
                               loop_eager_ms=C.bench(loop, args.quick, graph=False),
                               max_rel_err=C.rel_err(out.float(), loop().float()))
                    row["splits"] = args.splits or ragged_splits(n_req * N, block, m["hq"], m["hkv"], P, q.device,
                                                                 H200.attention)
                    if row["splits"] > 1:  # the split walk's gain over the one-pass launch
                        row["ragged_one_pass_ms"] = C.bench(lambda: ragged(1), args.quick)
                    row["speedup"] = row["loop_ms"] / row["ragged_ms"]
                    row["eager_speedup"] = row["loop_eager_ms"] / row["ragged_eager_ms"]
                    if args.check_ref or args.quick:
                        ref = ragged_attention_ref(q, k, v, k_pool, v_pool, *dev_args, scale)
                        row["ref_max_rel_err"] = C.rel_err(out.float(), ref.float())
                    print(f"ragged {mname} P={P} N={N} requests={n_req} splits={row['splits']}: first call "
                          f"ragged {ragged_first:.1f} ms / loop {loop_first:.1f} ms; steady ragged "
                          f"{row['ragged_ms'] * 1e3:.1f} us vs loop {row['loop_ms'] * 1e3:.1f} us (graph), "
                          f"{row['ragged_eager_ms'] * 1e3:.1f} vs {row['loop_eager_ms'] * 1e3:.1f} us (eager)",
                          flush=True)
                    rows.append(row)
    return C.emit("ragged_attention", rows, args)


if __name__ == "__main__":
    main()
