"""Benchmark prefix_attention (one state, and split along the prefix: prefix_attention_states with the
default split count), block_attention (merging one state, and the split states) and branch_attention
(bf16) at the Fast-dLLM-v2 attention shapes, with the roofline floor and the worst relative error
against the reference.

``--sweep``: instead, time the one-split prefix kernel at every (BLOCK_M, BLOCK_P, num_warps, num_stages)
of a small grid against the shape-based default, with all rows computed and with 19% of them (a
folded call's count), and print the best per point; rows "prefix_attention_sweep" (launch order of the
current kernel, row tiles outermost) and "prefix_attention_sweep_old" (the earlier default config and
launch order, row tiles fastest).

``--one-pass-sweep``: instead, time one_pass_attention (the block kernel walking the prefix itself, one
launch) at every config of a small grid against the two launches it replaces (prefix states + block merge,
with every row computed as in the plain graph and with 19% as in a folded call), and print the best per
point; rows "one_pass_sweep" and "two_kernels"."""
from __future__ import annotations

import math
import sys

from bench.kernels import _common as C  # first: sets TRITON_INTERPRET on CPU before the kernels import

import torch

from specfold_compile.ops.device_profile import H200
from specfold_compile.kernels.attention import (
    block_attention, branch_attention, one_pass_attention, prefix_attention,
    prefix_attention_states,
)
from specfold_compile.kernels.attention_launch import SPLIT_CHOICES, _one_pass_config
from specfold_compile.kernels.attention_ref import (
    block_attention_ref, branch_attention_ref, merge_split_states, prefix_attention_ref,
)


SWEEP = [(bm, bp, w, st) for bm in (32, 64, 128) for bp in (64, 128)
         for w, st in ((4, 2), (4, 3), (8, 2), (8, 3))]
OLD_DEFAULT = (64, 64, 4, 2)  # the earlier default at these shapes (rows * group <= 64 * 132)
ONE_PASS_SWEEP = [(bm, bp, w, st) for bm in (16, 32, 64, 128) for bp in (32, 64)
                  for w, st in ((4, 2), (4, 3), (8, 2))]


def prefix_problems(models, prefixes, dev, dt):
    """(model name, dims, scale, P, k_pre, v_pre) per model and prefix: one shared cache [2, Hkv, Pmax, D]
    whose strided views the kernels read."""
    for mname, m in models.items():
        scale = 1.0 / math.sqrt(m["d"])
        for P in prefixes:
            cache = torch.randn(2, m["hkv"], P + 64, m["d"], device=dev).to(dt)
            yield mname, m, scale, P, cache[0, :, :P], cache[1, :, :P]


FOLDED_SHARE = 0.19  # a folded call's computed rows in the sweeps (the per_check point r = 0.19)


def computed_counts(R: int, dev) -> list[tuple[int, torch.Tensor]]:
    """(computed rows, its device-side count) for every row and for a folded call's share of them."""
    return [(c, torch.tensor(c, device=dev)) for c in sorted({R, max(1, round(FOLDED_SHARE * R))})]


def block_problem(m, N, block, scale, k_pre, v_pre, dev, dt):
    """Every row of N branches computed (identity slots): (R, q, k, v, slot, the reference output)."""
    R = N * block
    q = torch.randn(R, m["hq"], m["d"], device=dev).to(dt)
    k = torch.randn(R, m["hkv"], m["d"], device=dev).to(dt)
    v = torch.randn(R, m["hkv"], m["d"], device=dev).to(dt)
    slot = torch.arange(R, device=dev).view(N, block)
    ref = block_attention_ref(q, k, v, slot, *prefix_attention_ref(q, k_pre, v_pre, scale), scale)
    return R, q, k, v, slot, ref


def sweep(args, models, block, prefixes, ns, dev, dt) -> list[dict]:
    rows = []
    for mname, m, scale, P, k_pre, v_pre in prefix_problems(models, prefixes, dev, dt):
        hq, d = m["hq"], m["d"]
        for N in ns:
            R = N * block
            q = torch.randn(R, hq, d, device=dev).to(dt)
            ro, rl = prefix_attention_ref(q, k_pre, v_pre, scale)
            for computed, count in computed_counts(R, dev):
                run = lambda cfg=None, outer=True: prefix_attention_states(  # noqa: E731
                    q, k_pre, v_pre, scale, count, splits=1, config=cfg, row_tiles_outer=outer)
                default_ms = C.bench(run, args.quick)
                point = dict(model=mname, P=P, N=N, rows=R, computed=computed, default_ms=default_ms)
                trials = [("prefix_attention_sweep", cfg, True) for cfg in (SWEEP[:2] if args.quick else SWEEP)]
                for kernel, cfg, outer in trials + [("prefix_attention_sweep_old", OLD_DEFAULT, False)]:
                    try:
                        o, lse = run(cfg, outer)
                    except Exception as exc:  # e.g. triton's OutOfResources: the tiles do not fit shared memory
                        print(f"config {cfg}: {type(exc).__name__}", file=sys.stderr)
                        continue
                    err = max(C.rel_err(o[0, :computed], ro[:computed]), C.rel_err(lse[0, :computed], rl[:computed]))
                    ms = C.bench(lambda: run(cfg, outer), args.quick)
                    rows.append(dict(point, kernel=kernel, config=list(cfg), ms=ms, max_rel_err=err))
                mine = [r for r in rows if all(r[k] == v for k, v in point.items())]
                best = min((r for r in mine if r["kernel"] == "prefix_attention_sweep"), key=lambda r: r["ms"])
                old_ms = [r["ms"] for r in mine if r["kernel"] == "prefix_attention_sweep_old"]
                print(f"best {mname} P={P} N={N} computed={computed}: {best['config']} {best['ms'] * 1e3:.1f} us "
                      f"(default {default_ms * 1e3:.1f} us, earlier default {old_ms[0] * 1e3 if old_ms else float('nan'):.1f} us)",
                      file=sys.stderr, flush=True)
    return rows


def split_sweep(args, models, block, prefixes, ns, dev, dt) -> list[dict]:
    rows = []
    for mname, m, scale, P, k_pre, v_pre in prefix_problems(models, prefixes, dev, dt):
        hq, d = m["hq"], m["d"]
        for N in ns:
            R, q, k, v, slot, ref = block_problem(m, N, block, scale, k_pre, v_pre, dev, dt)
            for computed, count in computed_counts(R, dev):
                default = prefix_attention_states(q, k_pre, v_pre, scale, count, tuning=H200.attention)[0].shape[0]
                point = dict(model=mname, P=P, N=N, rows=R, computed=computed, default_splits=default)
                mine = []
                for S in (SPLIT_CHOICES[:2] if args.quick else SPLIT_CHOICES):
                    o_s, lse_s = prefix_attention_states(q, k_pre, v_pre, scale, count, splits=S)
                    out = block_attention(q, k, v, slot, o_s, lse_s, scale)
                    err = C.rel_err(out.reshape(R, hq, d)[:computed], ref.reshape(R, hq, d)[:computed])
                    prefix_ms = C.bench(lambda: prefix_attention_states(q, k_pre, v_pre, scale, count, splits=S),
                                        args.quick)
                    block_ms = C.bench(lambda: block_attention(q, k, v, slot, o_s, lse_s, scale), args.quick)
                    mine.append(dict(point, kernel="prefix_split_sweep", splits=S, prefix_ms=prefix_ms,
                                     block_ms=block_ms, ms=prefix_ms + block_ms, max_rel_err=err))
                rows += mine
                best = min(mine, key=lambda r: r["ms"])
                chosen = [r["ms"] for r in mine if r["splits"] == default]
                print(f"split {mname} P={P} N={N} computed={computed}: best S={best['splits']} "
                      f"{best['ms'] * 1e3:.1f} us, default S={default} "
                      f"{chosen[0] * 1e3 if chosen else float('nan'):.1f} us", file=sys.stderr, flush=True)
    return rows


def one_pass_sweep(args, models, block, prefixes, ns, dev, dt) -> list[dict]:
    rows = []
    for mname, m, scale, P, k_pre, v_pre in prefix_problems(models, prefixes, dev, dt):
        hq, d = m["hq"], m["d"]
        for N in ns:
            R, q, k, v, slot, ref = block_problem(m, N, block, scale, k_pre, v_pre, dev, dt)
            point = dict(model=mname, P=P, N=N, rows=R, default_config=list(_one_pass_config()))
            mine = []
            for computed, count in computed_counts(R, dev):

                def two(count=count):
                    o_s, lse_s = prefix_attention_states(q, k_pre, v_pre, scale, count, tuning=H200.attention)
                    return block_attention(q, k, v, slot, o_s, lse_s, scale)
                err = C.rel_err(two().reshape(R, hq, d)[:computed], ref.reshape(R, hq, d)[:computed])
                mine.append(dict(point, kernel="two_kernels", computed=computed, ms=C.bench(two, args.quick),
                                 max_rel_err=err))
            for cfg in [None] + (ONE_PASS_SWEEP[:2] if args.quick else ONE_PASS_SWEEP):
                run = lambda cfg=cfg: one_pass_attention(q, k, v, slot, k_pre, v_pre, scale, config=cfg)  # noqa: E731
                try:
                    err = C.rel_err(run(), ref)
                except Exception as exc:  # e.g. triton's OutOfResources: the tiles do not fit shared memory
                    print(f"config {cfg}: {type(exc).__name__}", file=sys.stderr)
                    continue
                mine.append(dict(point, kernel="one_pass_sweep", config=None if cfg is None else list(cfg),
                                 ms=C.bench(run, args.quick), max_rel_err=err))
            rows += mine
            ones = [r for r in mine if r["kernel"] == "one_pass_sweep"]
            default = [f"{r['ms'] * 1e3:.1f} us" for r in ones if r["config"] is None] or ["failed"]
            best = f"{min(ones, key=lambda r: r['ms'])['config']} {min(r['ms'] for r in ones) * 1e3:.1f} us" \
                if ones else "none ran"
            two_ms = " / ".join(f"{r['ms'] * 1e3:.1f}" for r in mine if r["kernel"] == "two_kernels")
            print(f"one_pass {mname} P={P} N={N}: default {default[0]}, best {best}; two kernels "
                  f"(19% / all rows) {two_ms} us", file=sys.stderr, flush=True)
    return rows


def main(argv=None):
    def extra(ap):
        ap.add_argument("--sweep", action="store_true", help="time the prefix kernel over a grid of tile configs")
        ap.add_argument("--split-sweep", action="store_true",
                        help="time prefix + block kernels at every split count the rule can pick")
        ap.add_argument("--one-pass-sweep", action="store_true",
                        help="time one-pass attention over a grid of tile configs against the two kernels")
    args = C.parse_args(argv, __doc__, extra=extra)
    models, block, prefixes, ns = C.configs(args)
    if args.split_sweep:
        return C.emit("attention_split_sweep", split_sweep(args, models, block, prefixes, ns, C.device(),
                                                           torch.bfloat16), args)
    if args.one_pass_sweep:
        return C.emit("attention_one_pass_sweep", one_pass_sweep(args, models, block, prefixes, ns, C.device(),
                                                                 torch.bfloat16), args)
    if args.sweep:
        return C.emit("attention_sweep", sweep(args, models, block, prefixes, ns, C.device(), torch.bfloat16), args)
    dev = C.device()
    dt = torch.bfloat16
    rows = []
    for mname, m, scale, P, k_pre, v_pre in prefix_problems(models, prefixes, dev, dt):
        hq, hkv, d = m["hq"], m["hkv"], m["d"]
        for N in ns:
            R = N * block
            q4 = torch.randn(N, block, hq, d, device=dev).to(dt)
            k4 = torch.randn(N, block, hkv, d, device=dev).to(dt)
            v4 = torch.randn(N, block, hkv, d, device=dev).to(dt)
            q, k, v = q4.view(R, hq, d), k4.view(R, hkv, d), v4.view(R, hkv, d)
            slot = torch.arange(R, device=dev).view(N, block)
            count = torch.tensor(R, device=dev)

            o_pre, lse_pre = prefix_attention(q, k_pre, v_pre, scale, count)
            ro, rl = prefix_attention_ref(q, k_pre, v_pre, scale)
            err_p = max(C.rel_err(o_pre, ro), C.rel_err(lse_pre, rl))
            ms_p = C.bench(lambda: prefix_attention(q, k_pre, v_pre, scale, count), args.quick)
            fl_p = C.floor_ms(2 * hkv * P * d * 2 + R * hq * d * 2 + R * hq * (d + 1) * 4,
                              4.0 * R * hq * P * d)
            rows.append(dict(model=mname, kernel="prefix_attention", P=P, N=N, rows=R, ms=ms_p, **fl_p,
                             frac_of_floor=fl_p["floor_ms"] / ms_p, max_rel_err=err_p))

            ob = block_attention(q, k, v, slot, o_pre, lse_pre, scale)
            err_b = C.rel_err(ob, block_attention_ref(q, k, v, slot, ro, rl, scale))
            ms_b = C.bench(lambda: block_attention(q, k, v, slot, o_pre, lse_pre, scale), args.quick)
            fl_b = C.floor_ms(R * hq * d * 2 * 2 + 2 * R * hkv * d * 2 + R * hq * (d + 1) * 4,
                              4.0 * R * hq * block * d)
            rows.append(dict(model=mname, kernel="block_attention", P=P, N=N, rows=R, ms=ms_b, **fl_b,
                             frac_of_floor=fl_b["floor_ms"] / ms_b, max_rel_err=err_b))

            o_s, lse_s = prefix_attention_states(q, k_pre, v_pre, scale, count, tuning=H200.attention)
            splits = o_s.shape[0]
            err_s = max(C.rel_err(t, r) for t, r in zip(merge_split_states(o_s, lse_s), (ro, rl)))
            ms_s = C.bench(lambda: prefix_attention_states(q, k_pre, v_pre, scale, count, tuning=H200.attention), args.quick)
            rows.append(dict(model=mname, kernel="prefix_attention_states", P=P, N=N, rows=R, ms=ms_s, **fl_p,
                             frac_of_floor=fl_p["floor_ms"] / ms_s, max_rel_err=err_s, splits=splits))
            ob = block_attention(q, k, v, slot, o_s, lse_s, scale)
            err_b = C.rel_err(ob, block_attention_ref(q, k, v, slot, ro, rl, scale))
            ms_b = C.bench(lambda: block_attention(q, k, v, slot, o_s, lse_s, scale), args.quick)
            rows.append(dict(model=mname, kernel="block_attention_split_states", P=P, N=N, rows=R, ms=ms_b,
                             **fl_b, frac_of_floor=fl_b["floor_ms"] / ms_b, max_rel_err=err_b, splits=splits))

            oo = one_pass_attention(q, k, v, slot, k_pre, v_pre, scale)
            err_o = C.rel_err(oo, block_attention_ref(q, k, v, slot, ro, rl, scale))
            ms_o = C.bench(lambda: one_pass_attention(q, k, v, slot, k_pre, v_pre, scale), args.quick)
            fl_o = C.floor_ms(2 * hkv * P * d * 2 + R * hq * d * 2 * 2 + 2 * R * hkv * d * 2,
                              4.0 * R * hq * (P + block) * d)
            rows.append(dict(model=mname, kernel="one_pass_attention", P=P, N=N, rows=R, ms=ms_o, **fl_o,
                             frac_of_floor=fl_o["floor_ms"] / ms_o, max_rel_err=err_o))

            o = branch_attention(q4, k4, v4, k_pre, v_pre, scale, tuning=H200.attention)
            err = C.rel_err(o, branch_attention_ref(q4, k4, v4, k_pre, v_pre, scale))
            ms = C.bench(lambda: branch_attention(q4, k4, v4, k_pre, v_pre, scale, tuning=H200.attention), args.quick)
            fl = C.floor_ms(2 * hkv * P * d * 2 + 2 * R * hq * d * 2 + 2 * R * hkv * d * 2,
                            4.0 * R * hq * (P + block) * d)
            sdpa_ms = None
            if torch.cuda.is_available() and not C.interpreting():
                # dense SDPA baseline: [N, Hq, B, D] over [prefix ; block] keys (prefix expanded)
                kk = torch.cat([k_pre.unsqueeze(0).expand(N, -1, -1, -1), k4.transpose(1, 2)], 2)
                vv = torch.cat([v_pre.unsqueeze(0).expand(N, -1, -1, -1), v4.transpose(1, 2)], 2)
                qq = q4.transpose(1, 2)
                sdpa = torch.nn.functional.scaled_dot_product_attention
                sdpa_ms = C.bench(lambda: sdpa(qq, kk, vv, scale=scale, enable_gqa=True))
            rows.append(dict(model=mname, kernel="branch_attention", P=P, N=N, rows=R, ms=ms, **fl,
                             frac_of_floor=fl["floor_ms"] / ms, max_rel_err=err,
                             sdpa_precat_ms=sdpa_ms))
    return C.emit("attention", rows, args)


if __name__ == "__main__":
    main()
