"""Compile every Triton kernel's GPU launches ahead of time, on a machine without a GPU.

The CPU tests run the kernels under Triton's interpreter, which never lowers them for a GPU, knows none of
its limits, and makes the launchers pick their interpreter tile configs. This check calls each launcher as
it runs on a GPU (its GPU tile configs, every config of the packed linear's autotuner) at the real model
shapes (``_common.MODELS``: Fast-dLLM v2 1.5B and 7B; blocks of 32, 1 to 33 branches, prefixes of 512 and
2048 keys, 1 to 64 requests) on tensors of the meta device, with every launch recorded instead of run. It
then compiles each distinct launch for a CUDA target (default sm_90: H100, H200) through Triton's own
pipeline, down to a cubin by the ptxas that ships with Triton, and checks its shared memory against the
target's per-block limit. One row a distinct launch (kernel, its constexprs, warps, stages, shared bytes,
compile seconds); exits non-zero when a launch does not compile or does not fit.

    PYTHONPATH=. python bench/kernels/compile_all.py [--arch 90] [--models fastdllm-7b] [--shared-limit BYTES]
        [--out FILE.json]

It turns the interpreter off for itself (the kernels must be JIT functions, not interpreted ones), so it
runs in a process of its own. It reads Triton's launch internals (``JITFunction._pack_args``, the
binder), as pinned in requirements-ci.txt.
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported: @triton.jit reads it at decoration time

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from unittest import mock  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

from bench.kernels._common import BLOCK, MODELS  # noqa: E402  (the interpreter stays off: set to 0 above)
from specfold_compile.kernels import (block_attention, branch_attention, fold_gate, fold_gate_from_flags,  # noqa: E402
                                      folded_ragged_attention, one_pass_attention, packed_linear,
                                      prefix_attention_states, ragged_attention, resolve_folds, silu_mul)
from specfold_compile.ops.device_profile import H200  # noqa: E402

# the module (the package's name of the same spelling is its function)
packed_linear_module = importlib.import_module("specfold_compile.kernels.packed_linear")

# shared memory a block may use (bytes, opt-in maximum): sm_80 A100, sm_89 L4 / RTX 40, sm_90 H100 / H200
SHARED_LIMIT = {80: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024}


@contextlib.contextmanager
def recorded_launches(target: GPUTarget):
    """Within it, every Triton launch is recorded (its compile inputs for ``target``), not run; the packed
    linear takes its autotuner, whose every config is recorded. Yields the list of records."""
    backend = make_backend(target)
    records = []
    binders = {}

    def run(self, *args, grid, warmup, **kwargs):  # JITFunction.run's inputs, as it packs them to compile
        kwargs.setdefault("debug", False)
        if self not in binders:
            binders[self] = create_function_from_signature(self.signature, self.params, backend)
        bound, specialization, options = binders[self](*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, specialization, options)
        records.append(dict(fn=self, signature=signature, constexprs=constexprs, attrs=attrs,
                            options=options.__dict__))

    def tune(self, *args, **kwargs):  # Autotuner.run: each config it would time
        for config in self.configs:
            self.fn.run(*args, **kwargs, **config.all_kwargs())

    with mock.patch.object(JITFunction, "run", run), mock.patch.object(Autotuner, "run", tune), \
            mock.patch.object(packed_linear_module, "use_autotune", lambda: True):
        yield records


def _launch_key(rec) -> str:
    return repr((rec["fn"].__name__, sorted(rec["signature"].items()), sorted(rec["constexprs"].items()),
                 sorted(rec["attrs"].items()), sorted(rec["options"].items())))


def run_launchers(m: dict) -> None:
    """Each launcher at one model's shapes, as the backend and the serving engine call them."""
    dev, dt = "meta", torch.bfloat16
    hq, hkv, d, hid, ffn = m["hq"], m["hkv"], m["d"], m["hidden"], m["ffn"]
    scale = 1.0 / math.sqrt(d)
    t = H200.attention

    def empty(*shape, dtype=dt):
        return torch.empty(*shape, dtype=dtype, device=dev)

    count = empty((), dtype=torch.int64)
    for N in (1, 5, 17, 33, 256):  # the gate: one call's branches, up to a serving forward's 256 rows
        parents = empty(N, dtype=torch.int64)
        fold = empty(N, BLOCK, dtype=torch.bool)
        fold_gate(empty(N, BLOCK, hid), parents, empty((), dtype=torch.float32))
        resolve_folds(fold, parents)
        fold_gate_from_flags(fold, parents, fold_rows=empty(N, dtype=torch.bool), capacity=N * BLOCK // 2,
                             overflow_flag=empty(1, dtype=torch.bool))
    for N in (1, 5, 17, 33):  # the backend's folded attention and packed layers
        R = N * BLOCK
        q, k, v = empty(R, hq, d), empty(R, hkv, d), empty(R, hkv, d)
        slot = empty(N, BLOCK, dtype=torch.int64)
        for P in (512, 2048):
            cache = empty(2, hkv, P + 64, d)
            k_pre, v_pre = cache[0, :, :P], cache[1, :, :P]
            for splits in (None, 4):
                o, lse = prefix_attention_states(q, k_pre, v_pre, scale, count, splits=splits, tuning=t)
                block_attention(q, k, v, slot, o, lse, scale)
            prefix_attention_states(q, k_pre, v_pre, scale, count, splits=1,
                                    prefix_len=empty(1, dtype=torch.int32))
            one_pass_attention(q, k, v, slot, k_pre, v_pre, scale)
            branch_attention(q.view(N, BLOCK, hq, d), k.view(N, BLOCK, hkv, d), v.view(N, BLOCK, hkv, d), k_pre,
                             v_pre, scale, tuning=t)
        for K, M, bias in ((hid, (hq + 2 * hkv) * d, True), (hq * d, hid, False), (hid, 2 * ffn, False),
                           (ffn, hid, False)):
            packed_linear(empty(R, K), empty(M, K), empty(M) if bias else None, count,
                          min_block_r=H200.packed_linear_min_block_r)
        gate_up = empty(R, 2 * ffn)
        silu_mul(gate_up[:, :ffn], gate_up[:, ffn:], count)
    for n_req in (1, 16, 64):  # the serving engine: requests of 17 rows on a pool of 2048 positions a slot
        R = 17 * n_req
        pool = empty(n_req + 1, hkv, 2048, d)
        index = [empty(n_req + 1, dtype=torch.int32)] + [empty(n_req, dtype=torch.int32)] * 2
        q, k, v = empty(R, BLOCK, hq, d), empty(R, BLOCK, hkv, d), empty(R, BLOCK, hkv, d)
        for splits in (None, 4):
            ragged_attention(q, k, v, pool, pool, *index, scale, splits=splits, tuning=t)
        ragged_attention(q, k, v, pool, pool, *index, scale, causal=True)  # block writes and prefills
        P = R * BLOCK // 2  # packed rows: half of the positions computed
        for splits in (None, 4):
            folded_ragged_attention(empty(P, hq, d), empty(P, hkv, d), empty(P, hkv, d),
                                    empty(P, dtype=torch.int64), empty(R, BLOCK, dtype=torch.int64), pool, pool,
                                    *index, scale, splits=splits, tuning=t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90, choices=sorted(SHARED_LIMIT),
                    help="the CUDA compute capability to compile for (default 90)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated shapes (default: all)")
    ap.add_argument("--shared-limit", type=int, default=None,
                    help="shared memory a block may use, in bytes (default: the target's, SHARED_LIMIT)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    names = args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"--models: expected names among {sorted(MODELS)}, got {unknown}")
    if args.shared_limit is not None and args.shared_limit < 0:
        ap.error(f"--shared-limit: expected a byte count >= 0, got {args.shared_limit}")
    target = GPUTarget("cuda", args.arch, 32)
    with recorded_launches(target) as records:
        for name in names:
            run_launchers(MODELS[name])
    launches = {}
    for rec in records:
        launches.setdefault(_launch_key(rec), rec)
    rows = []
    limit = SHARED_LIMIT[args.arch] if args.shared_limit is None else args.shared_limit
    for rec in launches.values():
        row = dict(kernel=rec["fn"].__name__, num_warps=rec["options"].get("num_warps"),
                   num_stages=rec["options"].get("num_stages"),
                   constexprs={rec["fn"].arg_names[p[0]]: str(v) for p, v in rec["constexprs"].items()})
        start = time.perf_counter()
        try:
            kernel = triton.compile(ASTSource(rec["fn"], rec["signature"], rec["constexprs"], rec["attrs"]),
                                    target=target, options=rec["options"])
            row.update(shared_bytes=int(kernel.metadata.shared), ok=int(kernel.metadata.shared) <= limit)
            row["error"] = None if row["ok"] else f"shared memory {row['shared_bytes']} > {limit} bytes"
        except Exception as exc:  # a launch that does not compile is this check's finding
            row.update(shared_bytes=None, ok=False, error=f"{type(exc).__name__}: {str(exc)[:2000]}")
        row["compile_s"] = round(time.perf_counter() - start, 2)
        rows.append(row)
        print(f"{row['kernel']:24s} warps={row['num_warps']} stages={row['num_stages']} "
              f"shared={row['shared_bytes']} {row['compile_s']:.1f}s {'ok' if row['ok'] else row['error']}",
              flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(arch=args.arch, shared_limit=limit, triton=triton.__version__, torch=torch.__version__,
                           models=names, launches_recorded=len(records), rows=rows), f, indent=1)
    bad = [r for r in rows if not r["ok"]]
    print(f"sm_{args.arch}: {len(rows)} distinct launches of {len(records)} recorded, {len(bad)} failed",
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
