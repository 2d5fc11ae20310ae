"""Run every kernel at the real model shapes in bf16 and compare with the float32 reference.

PYTHONPATH=. python bench/kernels/check_all.py [--quick] [--out FILE.json]
Exits non-zero when any kernel's worst relative error (max |out-ref| / max |ref|) exceeds its
tolerance or a gate output differs from the reference.
"""
from __future__ import annotations

import math
import sys

from bench.kernels import _common as C  # first: sets TRITON_INTERPRET on CPU before the kernels import

import torch

from specfold_compile.ops.device_profile import H200
from specfold_compile.kernels import (
    block_attention, block_attention_ref, branch_attention, branch_attention_ref, fold_gate,
    fold_gate_ref, merge_split_states, one_pass_attention, packed_linear, packed_linear_ref, prefix_attention,
    prefix_attention_ref, prefix_attention_states, resolve_folds, resolve_folds_ref, silu_mul, silu_mul_ref,
)
from bench.kernels.bench_gate import make_problem

TOL = 2e-2


def main(argv=None):
    args = C.parse_args(argv, __doc__)
    models, block, prefixes, ns = C.configs(args)
    dev = C.device()
    dt = torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    N = ns[1]
    P = prefixes[-1]
    rows = []

    def record(model, kernel, err, tol=TOL):
        ok = err <= tol
        rows.append(dict(model=model, kernel=kernel, N=N, max_rel_err=err, tol=tol, ok=ok))

    for mname, m in models.items():
        hq, hkv, d, hid = m["hq"], m["hkv"], m["d"], m["hidden"]
        # gate: exact agreement on flags, origin, rows, count, slot
        h, parents = make_problem(N, block, hid, 0.1, dev, dt, gen)
        tau = torch.tensor(0.1, device=dev)
        out, ref = fold_gate(h, parents, tau), fold_gate_ref(h, parents, tau)
        record(mname, "fold_gate", float(sum(int((a != b).sum()) for a, b in zip(out, ref))), 0.0)
        fold = torch.rand(N, block, generator=gen).lt(0.6).to(dev)
        out, ref = resolve_folds(fold, parents), resolve_folds_ref(fold, parents)
        record(mname, "resolve_folds", float(sum(int((a != b).sum()) for a, b in zip(out, ref))), 0.0)
        _, _, count, slot = ref
        # attention on a packed problem with folds
        R = N * block
        scale = 1.0 / math.sqrt(d)
        cache = torch.randn(2, hkv, P + 64, d, device=dev).to(dt)
        k_pre, v_pre = cache[0, :, 7:P + 7], cache[1, :, :P]
        q = torch.randn(R, 1, hq, d, device=dev).to(dt)[:, 0]
        k = torch.randn(R, hkv, d, device=dev).to(dt)
        v = torch.randn(R, hkv, d, device=dev).to(dt)
        o_pre, lse_pre = prefix_attention(q, k_pre, v_pre, scale, count)
        ro, rl = prefix_attention_ref(q.float(), k_pre.float(), v_pre.float(), scale)
        c = int(count)
        record(mname, "prefix_attention.o", C.rel_err(o_pre[:c], ro[:c]))
        record(mname, "prefix_attention.lse", C.rel_err(lse_pre[:c], rl[:c]))
        ob = block_attention(q, k, v, slot, o_pre, lse_pre, scale)
        rb = block_attention_ref(q.float(), k.float(), v.float(), slot, ro, rl, scale)
        record(mname, "block_attention", C.rel_err(ob, rb))
        o_s, lse_s = prefix_attention_states(q, k_pre, v_pre, scale, count, splits=4)
        o_m, lse_m = merge_split_states(o_s[:, :c], lse_s[:, :c])
        record(mname, "prefix_attention_states.o", C.rel_err(o_m, ro[:c]))
        record(mname, "prefix_attention_states.lse", C.rel_err(lse_m, rl[:c]))
        record(mname, "block_attention(split states)", C.rel_err(block_attention(q, k, v, slot, o_s, lse_s, scale), rb))
        record(mname, "one_pass_attention", C.rel_err(one_pass_attention(q, k, v, slot, k_pre, v_pre, scale), rb))
        q4 = torch.randn(N, block, hq, d, device=dev).to(dt)
        k4 = torch.randn(N, block, hkv, d, device=dev).to(dt)
        v4 = torch.randn(N, block, hkv, d, device=dev).to(dt)
        o = branch_attention(q4, k4, v4, k_pre, v_pre, scale, tuning=H200.attention)
        r = branch_attention_ref(q4.float(), k4.float(), v4.float(), k_pre.float(), v_pre.float(), scale)
        record(mname, "branch_attention", C.rel_err(o, r))
        # packed linear at each projection shape, count in the middle
        for lname, K, M, bias in [("qkv", hid, (hq + 2 * hkv) * d, True), ("o_proj", hq * d, hid, False),
                                  ("gate_up", hid, 2 * m["ffn"], False), ("down", m["ffn"], hid, False)]:
            x = torch.randn(R, K, device=dev).to(dt)
            w = (torch.randn(M, K, device=dev) * K ** -0.5).to(dt)
            b = torch.randn(M, device=dev).to(dt) if bias else None
            y = packed_linear(x, w, b, count, min_block_r=H200.packed_linear_min_block_r)
            ref = packed_linear_ref(x.float(), w.float(), None if b is None else b.float())
            record(mname, f"packed_linear.{lname}", C.rel_err(y[:c], ref[:c]))
        # packed SwiGLU on the halves of a fused gate_up output, count in the middle
        gate, up = (torch.randn(R, 2 * m["ffn"], device=dev) * 3).to(dt).split(m["ffn"], dim=-1)
        record(mname, "silu_mul", C.rel_err(silu_mul(gate, up, count)[:c], silu_mul_ref(gate.float(), up.float())[:c]))
    res = C.emit("check_all", rows, args)
    bad = [r for r in rows if not r["ok"]]
    if bad:
        print(f"FAILED: {len(bad)} kernel checks over tolerance", file=sys.stderr)
        return 1
    print("all kernel checks passed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
