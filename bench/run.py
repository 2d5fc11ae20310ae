"""GPU benchmark suites. ``PYTHONPATH=. python -m bench.run --suite NAME [--quick]``.

Suites (each writes JSON under $OUT or bench/results/ and prints a table last):
  check       SPEC P1/P4 of the compiled model at real shapes in bf16 (Triton kernels), and a CUDA-graph
              capture of the folded forward replayed with new inputs and parents (no host sync).
  per_check   latency of one verification forward vs branches: dense eager, dense under Inductor,
              SpecFold at recompute ratios ~0.1/0.25/0.5, and the floor.
  memory      peak memory of one verification forward, dense vs SpecFold (7B shape).
  breakdown   time split of the folded forward by kernel family (torch.profiler), N = 17.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import torch

from specfold_compile.backend import collect_stats
from specfold_compile.models import build
from specfold_compile.reference import folded_verify

from .common import Deadline, draft_tokens, draft_tree, floor_ms, out_dir, time_cuda_graph, versions, write_json

MODELS = ("fast-dllm-v2-1.5b", "fast-dllm-v2-7b", "nld-3b")
CHANGED_FOR_RATIO = {0.1: 2, 0.25: 6, 0.5: 14}  # positions changed per draft -> about that recompute ratio
TAU = 0.3


def _inputs(model, n_rows: int, changed: int, seed: int):
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    vocab = min(cfg.vocab_size, 30000)
    main = torch.randint(0, vocab, (cfg.block_size,), generator=gen)
    parents = draft_tree(n_rows)
    tokens = draft_tokens(main, parents, changed, vocab, gen)
    return tokens.cuda(), torch.tensor(parents, device="cuda")


def _prefix(model, length: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, min(model.config.vocab_size, 30000), (length,), generator=gen).cuda()
    return model.prefill(ids)


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def suite_check(args) -> list[dict]:
    rows = []
    for name in ("fast-dllm-v2-1.5b", "nld-3b"):
        torch._dynamo.reset()
        model = build(name, device="cuda", dtype=torch.bfloat16, seed=0)
        cache = _prefix(model, 512, 1)
        tokens, parents = _inputs(model, 9, 4, 2)
        with torch.no_grad():
            dense = model(tokens, parents, cache)
            c0 = torch.compile(model, backend="specfold", options={"tau": 0.0, "kernels": "triton"})
            p1 = _rel(c0(tokens, parents, cache), dense)
            torch._dynamo.reset()
            ct = torch.compile(model, backend="specfold", options={"tau": TAU, "kernels": "triton"})
            with collect_stats() as s:
                out = ct(tokens, parents, cache)
            ref, _ = folded_verify(model, tokens, parents, cache, TAU, fold_masks=s.fold_masks)
            p4 = _rel(out, ref)
            p2 = _rel(out[0], dense[0])
            # CUDA graph: capture once, replay with other tokens and parents written into the inputs.
            static_tokens, static_parents = tokens.clone(), parents.clone()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    ct(static_tokens, static_parents, cache)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = ct(static_tokens, static_parents, cache)
            replay_errs = []
            for seed in range(3):
                t2, _ = _inputs(model, 9, 3 + seed, 10 + seed)
                p2_list = [-1] + [int(torch.randint(0, n, (1,))) for n in range(1, 9)]
                static_tokens.copy_(t2)
                static_parents.copy_(torch.tensor(p2_list, device="cuda"))
                graph.replay()
                with collect_stats() as s2:
                    eager_out = ct(t2, torch.tensor(p2_list, device="cuda"), cache)
                ref2, _ = folded_verify(model, t2, torch.tensor(p2_list, device="cuda"), cache, TAU,
                                        fold_masks=s2.fold_masks)
                replay_errs.append(max(_rel(static_out, eager_out), _rel(static_out, ref2)))
        rows.append({"model": name, "P1_rel_err_tau0": p1, "P2_main_rel_err": p2, "P4_rel_err_forced_masks": p4,
                     "recompute_ratio": s.recompute_ratio, "cuda_graph_replay_max_rel_err": max(replay_errs),
                     "ok": p1 < 2e-2 and p4 < 2e-2 and p2 < 2e-2 and max(replay_errs) < 2e-2})
        print(rows[-1], flush=True)
        del model, cache
        torch.cuda.empty_cache()
    return rows


def suite_per_check(args) -> list[dict]:
    rows: list[dict] = []
    deadline = Deadline(args.budget)
    ns = (1, 5, 9, 17, 33) if not args.quick else (1, 5)
    prefixes = (512, 2048) if not args.quick else (512,)
    for name in (MODELS if not args.quick else MODELS[:1]):
        torch._dynamo.reset()
        model = build(name, device="cuda", dtype=torch.bfloat16, seed=0)
        cfg = model.config
        folded = torch.compile(model, backend="specfold", options={"tau": TAU, "kernels": "triton"})
        inductor = torch.compile(model.verify, dynamic=True) if args.inductor and name != "nld-3b" else None
        for prefix in prefixes:
            cache = _prefix(model, prefix, 1)
            for n_rows in ns:
                if deadline.left() < 20:
                    print("per_check: time budget reached, stopping", flush=True)
                    return rows
                base = {"model": name, "prefix": prefix, "n_branches": n_rows}
                tokens, parents = _inputs(model, n_rows, 4, n_rows)
                try:
                    with torch.no_grad():
                        ms, cg = time_cuda_graph(lambda: model.verify(tokens, parents, cache))
                    rows.append({**base, "mode": "dense", "recompute_ratio": 1.0, "ms": ms, "cuda_graph": cg})
                    rows.append({**base, "mode": "floor", "recompute_ratio": 1.0, "cuda_graph": False,
                                 "ms": floor_ms(cfg, n_rows, n_rows * cfg.block_size, prefix)})
                    if inductor is not None and prefix == 512:
                        with torch.no_grad():
                            t0 = time.monotonic()
                            inductor(tokens, parents, cache)
                            compile_s = time.monotonic() - t0
                            ms, cg = time_cuda_graph(lambda: inductor(tokens, parents, cache))
                        rows.append({**base, "mode": "dense_compiled", "recompute_ratio": 1.0, "ms": ms,
                                     "cuda_graph": cg, "first_call_s": compile_s})
                    if n_rows == 1:
                        continue
                    for target, changed in CHANGED_FOR_RATIO.items():
                        tokens, parents = _inputs(model, n_rows, changed, 100 * n_rows + changed)
                        with torch.no_grad():
                            t0 = time.monotonic()
                            with collect_stats() as s:
                                folded(tokens, parents, cache)
                            first_s = time.monotonic() - t0
                            ratio = s.recompute_ratio
                            computed = cfg.block_size + round(ratio * (n_rows - 1) * cfg.block_size)
                            ms, cg = time_cuda_graph(lambda: folded(tokens, parents, cache))
                        rows.append({**base, "mode": "specfold", "recompute_ratio": ratio, "ms": ms,
                                     "cuda_graph": cg, "target_ratio": target, "first_call_s": first_s})
                        rows.append({**base, "mode": "floor", "recompute_ratio": ratio, "cuda_graph": False,
                                     "ms": floor_ms(cfg, n_rows, computed, prefix), "target_ratio": target})
                except Exception as exc:  # keep measuring the rest; record why this one failed
                    traceback.print_exc()
                    rows.append({**base, "mode": "error", "error": repr(exc)[:300]})
                print(json.dumps(rows[-1]), flush=True)
            del cache
        del model, folded, inductor
        torch.cuda.empty_cache()
    return rows


def suite_memory(args) -> list[dict]:
    rows = []
    name = "fast-dllm-v2-7b"
    torch._dynamo.reset()
    model = build(name, device="cuda", dtype=torch.bfloat16, seed=0)
    cfg = model.config
    folded = torch.compile(model, backend="specfold", options={"tau": TAU, "kernels": "triton"})
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for prefix in (2048, 8192):
        cache = _prefix(model, prefix, 1)
        cache_bytes = sum(t.numel() * t.element_size() for t in cache.keys + cache.values)
        for n_rows in (1, 9, 33):
            tokens, parents = _inputs(model, n_rows, 6, n_rows)
            for mode, fn in (("dense", lambda: model.verify(tokens, parents, cache)),
                             ("specfold", lambda: folded(tokens, parents, cache))):
                with torch.no_grad():
                    fn()  # compile / warm up outside the measurement
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    out = fn()
                    torch.cuda.synchronize()
                    peak = torch.cuda.max_memory_allocated()
                    del out
                rows.append({"model": name, "prefix": prefix, "n_branches": n_rows, "mode": mode,
                             "peak_bytes": peak, "extra_bytes": peak - base, "weight_bytes": weight_bytes,
                             "cache_bytes": cache_bytes,
                             "per_branch_cache_copy_bytes": cache_bytes * n_rows})
                print(json.dumps(rows[-1]), flush=True)
        del cache
    return rows


def suite_breakdown(args) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for name in ("fast-dllm-v2-1.5b", "fast-dllm-v2-7b"):
        torch._dynamo.reset()
        model = build(name, device="cuda", dtype=torch.bfloat16, seed=0)
        cache = _prefix(model, 512, 1)
        folded = torch.compile(model, backend="specfold", options={"tau": TAU, "kernels": "triton"})
        tokens, parents = _inputs(model, 17, 6, 17)
        with torch.no_grad():
            for _ in range(3):
                folded(tokens, parents, cache)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    folded(tokens, parents, cache)
                torch.cuda.synchronize()
        groups: dict[str, float] = {}
        for evt in prof.key_averages():
            key = evt.key.lower()
            us = evt.device_time_total if hasattr(evt, "device_time_total") else evt.cuda_time_total
            if "fold_flag" in key or "resolve" in key:
                group = "gate+origin+compaction"
            elif "prefix_attn" in key:
                group = "attention_prefix"
            elif "block_attn" in key:
                group = "attention_block_merge"
            elif "packed_linear" in key:
                group = "packed_linears"
            elif "index" in key or "gather" in key or "scatter" in key:
                group = "packing_gather_scatter"
            elif "gemm" in key or "matmul" in key or "cutlass" in key or "sm90" in key:
                group = "dense_gemm(o_proj,head)"
            else:
                group = "rest(elementwise,norms)"
            groups[group] = groups.get(group, 0.0) + us / 5 / 1e3
        total = sum(groups.values())
        for group, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
            rows.append({"model": name, "n_branches": 17, "prefix": 512, "part": group, "ms_per_forward": ms,
                         "ms_per_layer": ms / model.config.num_layers, "share": ms / total})
            print(json.dumps(rows[-1]), flush=True)
        del model, cache, folded
        torch.cuda.empty_cache()
    return rows


SUITES = {"check": suite_check, "per_check": suite_per_check, "memory": suite_memory, "breakdown": suite_breakdown}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", action="append", choices=sorted(SUITES), required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for per_check")
    ap.add_argument("--no-inductor", dest="inductor", action="store_false")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.run needs a CUDA device", file=sys.stderr)
        return 2
    out = out_dir()
    print(versions(), flush=True)
    status = 0
    for suite in args.suite:
        t0 = time.monotonic()
        try:
            rows = SUITES[suite](args)
        except Exception:
            traceback.print_exc()
            status = 1
            continue
        write_json(out / f"{suite}.json", rows, {"suite": suite, "seconds": time.monotonic() - t0})
        print(f"== {suite}: {len(rows)} rows in {time.monotonic() - t0:.0f}s", flush=True)
        if suite == "check" and not all(r.get("ok") for r in rows):
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
