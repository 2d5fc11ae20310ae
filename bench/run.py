"""GPU benchmark suites. ``PYTHONPATH=. python -m bench.run --suite NAME [--quick]``.

Suites (each writes JSON under $OUT or bench/results/ and prints every row as JSON as it is measured):
  check       SPEC P1/P4 of the compiled model at real shapes in bf16 (Triton kernels), judged against an
              fp32 copy, and a CUDA-graph capture of the folded forward replayed with new inputs and
              parents (no host sync).
  per_check   latency of one verification forward vs branches: dense eager, dense under Inductor,
              SpecFold at recompute ratios ~0.1/0.25/0.5, and the floor.
  memory      peak memory of one verification forward, dense vs SpecFold (7B shape).
  breakdown   time split of one forward by kernel family (torch.profiler), N = 17; --breakdown-modes.
Ablations: --specfold-no-inductor and --specfold-graph-flags add per_check modes (and breakdown modes of
the same names) with options["inductor"]=False or options["gate_flags"]="graph".
  end_to_end  vanilla / Spiffy (eager and under Inductor) / SpecFold decoding of the trained model on
              the task suite: accuracy and real tokens/s, plus tokens/s projected to the 1.5B/7B shapes
              from latencies measured here (or read from a per_check JSON with --latencies;
              bench/project.py).
  writes      latency of one block write (prefix-cache append), eager and under Inductor; rows in
              per_check's format (mode write / write_compiled), to merge into per_check.json.
  launch      host dispatch of one verification call: CUDA-graph against launched latency (plain calls,
              as generate runs them), host time to enqueue, CUDA launches per call, cProfile of the host.
  decode_loop generate() with every verification call replayed from a CUDA graph (cuda_graphs) against
              launched calls: the trained model's task suite (real tokens/s, same tokens), and ms per
              verification step at real shapes (--models, default the 1.5B).
per_check and writes rows carry both ``ms`` (CUDA-graph replays) and ``launched_ms`` (plain calls each
waited for); ``bench.project`` projects decoding with either.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback

import torch

from specfold_compile.ops import fold_ops
from specfold_compile.backend import SpecFoldSettings, collect_stats, compile_graph, fold_launched_calls, specfold_backend
from specfold_compile.decoding import mark_dynamic_shapes
from specfold_compile.models import build
from specfold_compile.reference import folded_verify

from .common import (Deadline, draft_tokens, draft_tree, floor_ms, out_dir, time_cuda_graph, time_launched, versions,
                     write_json)
from .plot import PLOTS, plot_results

MODELS = ("fast-dllm-v2-1.5b", "fast-dllm-v2-7b", "nld-3b")
# --cpu-dry-run swaps these for tiny presets on the CPU (torch kernels, no CUDA graphs) to check the
# suites' logic before spending GPU time; its numbers mean nothing.
DEVICE, KERNELS, SHAPE = "cuda", "triton", {}
# Positions changed per draft (of 32) -> about that recompute ratio. Where computed rows outgrow the
# packed linears' cuBLAS head (dense_fraction) latency steps up; points on both sides of that step for
# dense_fraction 0.3 (0.28 / 0.34) and 0.45 (0.44 / 0.59) keep the end_to_end projection, which
# interpolates between points, from smearing it.
CHANGED_FOR_RATIO = {0.1: 2, 0.25: 6, 0.3: 9, 0.35: 11, 0.5: 14, 0.6: 19}
TAU = 0.3
# The branch counts, plus 13: where the backend's cost model starts folding at the 1.5B shape
# (12) and the branch counts most of the task suite's Spiffy calls have (13-16).
PER_CHECK_NS = (1, 5, 9, 13, 17, 33)


def _inputs(model, n_rows: int, changed: int, seed: int, cache=None):
    """Tokens and parents of one verification call; with ``cache``, N and the prefix length are marked
    dynamic as the decode loop marks them, so compiled modes trace the graphs a real decode runs
    (one per size class) instead of recompiling per N and prefix."""
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    vocab = min(cfg.vocab_size, 30000)
    main = torch.randint(0, vocab, (cfg.block_size,), generator=gen)
    parents = draft_tree(n_rows)
    tokens = draft_tokens(main, parents, changed, vocab, gen).to(DEVICE)
    parents = torch.tensor(parents, device=DEVICE)
    if cache is not None:
        mark_dynamic_shapes(tokens, parents, cache)
    return tokens, parents


def _timed(fn) -> dict:
    """A row's timings: ``ms``, the median of CUDA-graph replays (kernel time and the gaps between
    kernels; ``cuda_graph`` says whether capture worked), and ``launched_ms``, plain calls each waited
    for, as a decode loop without CUDA graphs runs them (host dispatch included)."""
    ms, captured = time_cuda_graph(fn)
    return {"ms": ms, "cuda_graph": captured, "launched_ms": time_launched(fn)}


def _fraction(text: str) -> float:
    """argparse type: a float in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {value}")
    return value


def _logit_positions(n_rows: int, block: int, fraction: float | None, seed: int) -> torch.Tensor | None:
    """``fraction`` of the N x B flat positions (at least one), random and sorted, marked dynamic as the
    decode loop marks its masked positions; None (every position's logits) without a fraction."""
    if fraction is None:
        return None
    count = max(1, round(fraction * n_rows * block))
    gen = torch.Generator().manual_seed(seed)
    positions = torch.randperm(n_rows * block, generator=gen)[:count].sort().values.to(DEVICE)
    if count > 1:
        torch._dynamo.maybe_mark_dynamic(positions, 0)
    return positions


def _model(args, name: str):
    """A random bf16 model of this preset (seed 0); q/k/v and gate/up fused (the default) unless
    --no-fuse-projections."""
    return build(name, device=DEVICE, dtype=torch.bfloat16, seed=0,
                 fuse_projections=getattr(args, "fuse_projections", True), **SHAPE.get(name, {}))


def _prefix(model, length: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, min(model.config.vocab_size, 30000), (length,), generator=gen).to(DEVICE)
    return model.prefill(ids)


def _device_name() -> str:
    return torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


_FOLD_OPS = (fold_ops.FOLD_GATE, fold_ops.FOLDED_ATTENTION, fold_ops.PACKED_LINEAR, fold_ops.PACKED_SILU_MUL)


def _impl(node) -> str:
    """The fold op's ``impl`` argument ("torch" / "triton"), found by name in its schema."""
    names = [a.name for a in node.target._schema.arguments]
    return node.args[names.index("impl")]


def _op_counts(graphs) -> dict:
    """How many fold ops (and leftover dense linears) the rewritten graphs run, with which kernels."""
    counts: dict = {}
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target in _FOLD_OPS:
                key = f"{node.target.name()}[{_impl(node)}]"
            elif node.target in (torch._C._nn.linear, torch.nn.functional.linear):
                key = "dense linear"
            else:
                continue
            counts[key] = counts.get(key, 0) + 1
    return counts


def _graph_replay_errors(model, compiled, tokens, parents, cache) -> list[float]:
    """Capture the compiled folded forward once; replay it with other tokens and parents written into
    its static inputs; compare with a plain call on the same inputs."""
    static_tokens, static_parents = tokens.clone(), parents.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            compiled(static_tokens, static_parents, cache)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = compiled(static_tokens, static_parents, cache)
    errs = []
    for seed in range(3):
        t2, _ = _inputs(model, tokens.shape[0], 3 + seed, 10 + seed)
        p2 = torch.tensor([-1] + [int(torch.randint(0, n, (1,))) for n in range(1, tokens.shape[0])], device=DEVICE)
        static_tokens.copy_(t2)
        static_parents.copy_(p2)
        graph.replay()
        errs.append(_rel(static_out, compiled(t2, p2, cache)))
    return errs


def suite_check(args) -> list[dict]:
    """bf16 results judged against an fp32 copy of the same model: the compiled folded forward must be
    no further from fp32 than the bf16 dense forward (resp. bf16 reference) is, i.e. only rounding."""
    rows = []
    for name in ("fast-dllm-v2-1.5b", "nld-3b"):
        torch._dynamo.reset()
        model = _model(args, name)
        model32 = build(name, device=DEVICE, dtype=torch.float32, seed=None, **SHAPE.get(name, {}))
        model32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        cache, cache32 = _prefix(model, 512, 1), _prefix(model32, 512, 1)
        tokens, parents = _inputs(model, 9, 4, 2)
        with torch.no_grad():
            dense, dense32 = model(tokens, parents, cache), model32(tokens, parents, cache32)
            c0 = torch.compile(model, backend=specfold_backend,
                               options={"tau": 0.0, "kernels": KERNELS, "fold_min_branches": 2})
            p1 = _rel(c0(tokens, parents, cache), dense32)
            p1_dense = _rel(dense, dense32)
            torch._dynamo.reset()
            rewritten: list = []

            def backend(gm, example_inputs):  # specfold, keeping the rewritten graph to count its ops
                # every multi-branch call folded: the check is about the folded forward (the default
                # cost model runs the plain graph at N = 9 on the 1.5B shape)
                gm = compile_graph(gm, SpecFoldSettings(tau=TAU, kernels=KERNELS, fold_min_branches=2))
                rewritten.append(gm)
                if DEVICE == "cuda":  # as specfold_backend does by default on CUDA
                    from torch._inductor.compile_fx import compile_fx

                    return compile_fx(gm, example_inputs)
                return gm.forward

            ct = torch.compile(model, backend=backend)
            with collect_stats() as s:
                out = ct(tokens, parents, cache)
            graph_ops = _op_counts(rewritten)
            ref, _ = folded_verify(model, tokens, parents, cache, TAU, fold_masks=s.fold_masks)
            ref32, _ = folded_verify(model32, tokens, parents, cache32, TAU, fold_masks=s.fold_masks)
            p4, p4_ref = _rel(out, ref32), _rel(ref, ref32)
            p2 = _rel(out[0], dense32[0])
            replay_errs = _graph_replay_errors(model, ct, tokens, parents, cache) if DEVICE == "cuda" else [0.0]
        ok = p1 <= 1.5 * p1_dense + 1e-3 and p4 <= 1.5 * p4_ref + 1e-3 and max(replay_errs) < 1e-3
        rows.append({"model": name, "P1_vs_fp32": p1, "dense_bf16_vs_fp32": p1_dense, "P2_main_vs_fp32": p2,
                     "P4_vs_fp32_ref": p4, "bf16_ref_vs_fp32_ref": p4_ref, "recompute_ratio": s.recompute_ratio,
                     "cuda_graph_replay_vs_call": max(replay_errs), "graph_ops": graph_ops, "ok": ok})
        print(rows[-1], flush=True)
        del model, model32, cache, cache32
        torch.cuda.empty_cache()
    return rows


def _reference_ratio(model, tokens, parents, cache) -> float:
    """The recompute ratio SPEC's gates decide on these inputs (reference implementation)."""
    with torch.no_grad():
        _, masks = folded_verify(model, tokens, parents, cache, TAU)
    draft = [m[1:] for m in masks]
    return sum(int((~m).sum()) for m in draft) / sum(m.numel() for m in draft)


def suite_per_check(args) -> list[dict]:
    rows: list[dict] = []

    def add(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    deadline = Deadline(args.budget)
    ns = args.ns or (PER_CHECK_NS if not args.quick else (1, 5))
    prefixes = args.prefixes or ((512, 2048) if not args.quick else (512,))
    ratios = {t: c for t, c in CHANGED_FOR_RATIO.items() if not args.ratios or t in args.ratios}
    for name in args.models or (MODELS if not args.quick else MODELS[:1]):
        torch._dynamo.reset()
        model = _model(args, name)
        cfg = model.config
        options = {"tau": TAU, "kernels": KERNELS, "fold_head": args.fold_head, "dense_fraction": args.dense_fraction,
                   "min_spill_us": args.min_spill_us, "fold_min_branches": args.fold_min_branches,
                   "fold_launched": args.fold_launched, "combo_kernels": args.combo_kernels}
        folded = torch.compile(model, backend=specfold_backend, options=options)
        # Ablations, each its own mode: the rewritten graph without the default Inductor lowering on
        # CUDA; the gate's fold flags computed in the graph (options["gate_flags"]="graph").
        folded_plain = torch.compile(model, backend=specfold_backend, options={**options, "inductor": False}) \
            if args.specfold_no_inductor else None
        folded_graph_flags = torch.compile(model, backend=specfold_backend, options={**options, "gate_flags": "graph"}) \
            if args.specfold_graph_flags else None
        inductor = torch.compile(model.verify, dynamic=True) if args.inductor else None
        for prefix in prefixes:
            cache = _prefix(model, prefix, 1)
            for n_rows in ns:
                if deadline.left() < 20:
                    print("per_check: time budget reached, stopping", flush=True)
                    return rows
                base = {"model": name, "prefix": prefix, "n_branches": n_rows,
                        **({} if args.fuse_projections else {"fused_projections": False}),
                        **({} if args.one_pass_max_prefix is None
                           else {"one_pass_max_prefix": args.one_pass_max_prefix}),
                        **({} if args.logit_fraction is None else {"logit_fraction": args.logit_fraction})}
                tokens, parents = _inputs(model, n_rows, 4, n_rows, cache)
                # the decode loop asks for the masked positions' logits only (--logit-fraction of the rows)
                logits_at = _logit_positions(n_rows, cfg.block_size, args.logit_fraction, n_rows)
                logit_rows = None if logits_at is None else logits_at.numel()
                try:
                    with torch.no_grad():
                        timed = _timed(lambda: model.verify(tokens, parents, cache, logits_at))
                    add({**base, "mode": "dense", "recompute_ratio": 1.0, **timed})
                    add({**base, "mode": "floor", "recompute_ratio": 1.0, "cuda_graph": False,
                                 "ms": floor_ms(cfg, n_rows, n_rows * cfg.block_size, prefix, logit_rows)})
                    if inductor is not None:
                        try:
                            with torch.no_grad():
                                t0 = time.monotonic()
                                inductor(tokens, parents, cache, logits_at)
                                compile_s = time.monotonic() - t0
                                timed = _timed(lambda: inductor(tokens, parents, cache, logits_at))
                            add({**base, "mode": "dense_compiled", "recompute_ratio": 1.0, **timed,
                                         "first_call_s": compile_s})
                        except Exception as exc:  # record once, stop trying this model's dense compile
                            traceback.print_exc()
                            add({**base, "mode": "error", "what": "dense_compiled", "error": repr(exc)[:300]})
                            inductor = None
                    if n_rows == 1:
                        # Nothing to fold: what backend="specfold" runs for a one-branch call (the plain
                        # graph, Inductor-lowered on CUDA); end_to_end projections charge SpecFold's N = 1
                        # calls with it.
                        with torch.no_grad():
                            t0 = time.monotonic()
                            folded(tokens, parents, cache, logits_at)
                            first_s = time.monotonic() - t0
                            timed = _timed(lambda: folded(tokens, parents, cache, logits_at))
                        add({**base, "mode": "specfold", "recompute_ratio": 1.0, **timed, "first_call_s": first_s})
                        continue
                    for target, changed in ratios.items():
                        tokens, parents = _inputs(model, n_rows, changed, 100 * n_rows + changed, cache)
                        t0 = time.monotonic()
                        # the gate's decisions on these inputs (launched: folded even where launched calls
                        # run the plain graph, fold_launched=False; the CUDA-graph capture below folds)
                        with torch.no_grad(), collect_stats() as s, fold_launched_calls():
                            folded(tokens, parents, cache, logits_at)
                        first_call_s = {"specfold": time.monotonic() - t0}
                        # A call the backend ran plain (too few branches to pay) has no gate decisions:
                        # the reference gates say what folding would have computed (for the floor).
                        folds = s.calls > 0
                        ratio = s.recompute_ratio if folds else _reference_ratio(model, tokens, parents, cache)
                        computed = cfg.block_size + round(ratio * (n_rows - 1) * cfg.block_size)
                        add({**base, "mode": "floor", "recompute_ratio": ratio, "cuda_graph": False,
                                     "ms": floor_ms(cfg, n_rows, computed, prefix, logit_rows), "target_ratio": target})
                        for mode, fn in (("specfold", folded), ("specfold_no_inductor", folded_plain),
                                         ("specfold_graph_flags", folded_graph_flags)):
                            if fn is None:
                                continue
                            with torch.no_grad():
                                if mode not in first_call_s:
                                    t0 = time.monotonic()
                                    fn(tokens, parents, cache, logits_at)
                                    first_call_s[mode] = time.monotonic() - t0
                                timed = _timed(lambda: fn(tokens, parents, cache, logits_at))
                            add({**base, "mode": mode, "recompute_ratio": ratio, **timed,
                                         "target_ratio": target, "first_call_s": first_call_s[mode], "folded": folds,
                                         "dense_fraction": args.dense_fraction, "min_spill_us": args.min_spill_us,
                                         "fold_min_branches": args.fold_min_branches,
                                         "fold_launched": args.fold_launched,
                                         **({"fold_head": True} if args.fold_head else {}),
                                         **({"combo_kernels": True} if args.combo_kernels else {})})
                except Exception as exc:  # keep measuring the rest; record why this one failed
                    traceback.print_exc()
                    add({**base, "mode": "error", "error": repr(exc)[:300]})
            del cache
        del model, folded, folded_plain, folded_graph_flags, inductor
        torch.cuda.empty_cache()
    return rows


def suite_writes(args) -> list[dict]:
    """Latency of one block write (``model.append_block``: the 32 finished tokens appended to the prefix
    cache, the next block's seed logits), eager and under torch.compile's default backend (what
    ``generate(compile_writes=True)`` runs), at prefix 512 and 2048. Rows follow per_check's, with mode
    ``write`` / ``write_compiled`` at N = 1, so ``bench.plot`` merges them into per_check.json, where the
    end_to_end projections read them."""
    rows: list[dict] = []
    deadline = Deadline(args.budget)
    for name in args.models or (MODELS if not args.quick else MODELS[:1]):
        torch._dynamo.reset()
        model = _model(args, name)
        compiled = model.compiled_method("append_block")
        causal = model.config.family == "nld"
        for prefix in args.prefixes or ((512, 2048) if not args.quick else (512,)):
            if deadline.left() < 20:
                print("writes: time budget reached, stopping", flush=True)
                return rows
            cache = _prefix(model, prefix, 1)
            block, _ = _inputs(model, 1, 0, prefix)
            block = block[0]
            for t in (*cache.keys, *cache.values):  # as write_block(compiled=True) marks them
                torch._dynamo.maybe_mark_dynamic(t, 1)
            for mode, fn in (("write", model.append_block), ("write_compiled", compiled)):
                try:
                    with torch.no_grad():
                        t0 = time.monotonic()
                        fn(cache.keys, cache.values, block, causal)
                        first_s = time.monotonic() - t0
                        timed = _timed(lambda: fn(cache.keys, cache.values, block, causal))
                    rows.append({"model": name, "prefix": prefix, "n_branches": 1, "mode": mode,
                                 "recompute_ratio": 1.0, **timed, "first_call_s": first_s})
                except Exception as exc:
                    traceback.print_exc()
                    rows.append({"model": name, "prefix": prefix, "n_branches": 1, "mode": "error",
                                 "what": mode, "error": repr(exc)[:300]})
                print(json.dumps(rows[-1]), flush=True)
            del cache
        del model, compiled
        torch.cuda.empty_cache()
    return rows


def suite_memory(args) -> list[dict]:
    if DEVICE != "cuda":
        print("this suite measures CUDA memory/kernels: skipped in --cpu-dry-run", flush=True)
        return []
    rows = []
    name = "fast-dllm-v2-7b"
    torch._dynamo.reset()
    model = _model(args, name)
    cfg = model.config
    folded = torch.compile(model, backend=specfold_backend, options={"tau": TAU, "kernels": KERNELS})
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for prefix in (2048, 8192):
        cache = _prefix(model, prefix, 1)
        cache_bytes = sum(t.numel() * t.element_size() for t in cache.keys + cache.values)
        for n_rows in (1, 9, 33):
            tokens, parents = _inputs(model, n_rows, 6, n_rows, cache)
            for mode, fn in (("dense", lambda: model.verify(tokens, parents, cache)),
                             ("specfold", lambda: folded(tokens, parents, cache))):
                # the folded forward's memory where the backend folds (also launched, as a capture would)
                with torch.no_grad(), fold_launched_calls():
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


def _kernel_group(name: str) -> str:
    """Which part of the forward a CUDA kernel belongs to, from its name."""
    key = name.lower()
    if "fold_flag" in key:
        return "gate"
    if "resolve" in key:
        return "origin+compaction"
    if "prefix_attn" in key:
        return "attention_prefix"
    if "block_attn" in key:
        return "attention_block_merge"
    if "_packed_linear_body" in key:  # the spill GEMM (Inductor names kernels after their inputs too)
        return "packed_linear_spill"
    if "silu_mul" in key:
        return "packed_swiglu"
    if "index" in key or "gather" in key or "scatter" in key:
        return "packing_gather_scatter"
    if "gemm" in key or "matmul" in key or "cutlass" in key or "sm90" in key or "nvjet" in key:
        return "dense_gemm"
    return "rest(elementwise,norms)"


def suite_breakdown(args) -> list[dict]:
    """Kernel time per part of one verification forward (torch.profiler, prefix 512, N = 17 or --ns),
    for the folded forward and, with --breakdown-modes, the dense one eager (``dense``) and under
    Inductor (``dense_compiled``) and the ablations."""
    if DEVICE != "cuda":
        print("this suite measures CUDA memory/kernels: skipped in --cpu-dry-run", flush=True)
        return []
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for name in args.models or ("fast-dllm-v2-1.5b", "fast-dllm-v2-7b"):
        torch._dynamo.reset()
        model = _model(args, name)
        cache = _prefix(model, 512, 1)
        fns = {}  # one compiled callable per mode, reused across N (N is marked dynamic: no recompile)
        for mode in args.breakdown_modes:
            if mode == "dense":
                fns[mode] = model.verify
            elif mode == "dense_compiled":
                fns[mode] = torch.compile(model.verify, dynamic=True)
            else:
                options = {"tau": TAU, "kernels": KERNELS, "dense_fraction": args.dense_fraction,
                           "min_spill_us": args.min_spill_us, "combo_kernels": args.combo_kernels,
                           **({"inductor": False} if mode == "specfold_no_inductor" else {}),
                           **({"gate_flags": "graph"} if mode == "specfold_graph_flags" else {})}
                fns[mode] = torch.compile(model, backend=specfold_backend, options=options)
        for n_rows, mode in [(n, m) for n in (args.ns or (17,)) for m in args.breakdown_modes]:
            tokens, parents = _inputs(model, n_rows, 6, n_rows, cache)
            fn = fns[mode]
            with torch.no_grad(), fold_launched_calls():  # folded where a CUDA-graph capture folds
                with collect_stats() as s:
                    fn(tokens, parents, cache)
                for _ in range(3):
                    fn(tokens, parents, cache)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        fn(tokens, parents, cache)
                    torch.cuda.synchronize()
            tag = f"{name}_{mode}_n{n_rows}"
            (out_dir() / f"breakdown_kernels_{tag}.txt").write_text(  # every kernel, for finer reading
                prof.key_averages().table(sort_by="cuda_time_total", row_limit=60, max_name_column_width=90))
            groups: dict[str, list] = {}
            for evt in prof.key_averages():
                us = evt.device_time_total if hasattr(evt, "device_time_total") else evt.cuda_time_total
                if us <= 0:
                    continue
                group = groups.setdefault(_kernel_group(evt.key), [0.0, 0])
                group[0] += us / 5 / 1e3
                group[1] += evt.count / 5
            total = sum(ms for ms, _ in groups.values())
            for group, (ms, launches) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
                rows.append({"model": name, "mode": mode, "n_branches": n_rows, "prefix": 512,
                             "recompute_ratio": s.recompute_ratio if s.layers else 1.0, "part": group,
                             "ms_per_forward": ms, "ms_per_layer": ms / model.config.num_layers, "share": ms / total,
                             "kernels_per_forward": launches})
                print(json.dumps(rows[-1]), flush=True)
        fn = None  # the last mode's callable holds the model too
        del model, cache, fns
        torch.cuda.empty_cache()
    return rows


def _host_probe(sync, launches: int = 2000) -> dict:
    """This host's cost of one launch, apart from any model: a tiny in-place add (eager PyTorch) and,
    on CUDA, an empty Triton kernel (Triton's Python launcher, as our kernels launch), us per launch."""
    x = torch.zeros(16, device=DEVICE)

    def per_launch_us(fn) -> float:
        for _ in range(50):
            fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(launches):
            fn()
        sync()
        return 1e6 * (time.perf_counter() - t0) / launches

    row = {"mode": "host_probe", "eager_add_us": per_launch_us(lambda: x.add_(1))}
    if DEVICE == "cuda":
        import triton

        @triton.jit
        def _touch(ptr):
            pass

        row["triton_launch_us"] = per_launch_us(lambda: _touch[(1,)](x))
    return row


def suite_launch(args) -> list[dict]:
    """Host dispatch of one verification call (prefix 512, N = 1 and 17 or --ns, r ~ 0.25, --logit-fraction
    as per_check): CUDA-graph latency (``ms``) against plain calls each waited for (``launched_ms``, what
    ``generate`` pays), the host's time to enqueue a call (``host_ms``: the call returns before its kernels
    finish), CUDA launches per call (torch.profiler's runtime events), and the host's hottest functions
    (cProfile, ``launch_profile_*.txt``) for dense under Inductor and SpecFold; first, this host's cost of one
    launch apart from any model (``host_probe``)."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile

    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    rows = [_host_probe(sync)]
    print(json.dumps(rows[-1]), flush=True)
    for name in args.models or ("fast-dllm-v2-1.5b",):
        torch._dynamo.reset()
        model = _model(args, name)
        cache = _prefix(model, 512, 1)
        options = {"tau": TAU, "kernels": KERNELS, "dense_fraction": args.dense_fraction,
                   "min_spill_us": args.min_spill_us, "fold_min_branches": args.fold_min_branches,
                   "fold_launched": args.fold_launched}
        fns = {"dense_compiled": torch.compile(model.verify, dynamic=True),
               "specfold": torch.compile(model, backend=specfold_backend, options=options)}
        for n_rows, mode in [(n, m) for n in (args.ns or (1, 17)) for m in fns]:
            tokens, parents = _inputs(model, n_rows, CHANGED_FOR_RATIO[0.25], n_rows, cache)
            logits_at = _logit_positions(n_rows, model.config.block_size, args.logit_fraction, n_rows)
            call = lambda: fns[mode](tokens, parents, cache, logits_at)  # noqa: E731
            try:
                with torch.no_grad():
                    t0 = time.monotonic()
                    with collect_stats() as s, fold_launched_calls():
                        call()  # folded where a capture folds: the gates' decisions, and the graph warmed
                    first_s = time.monotonic() - t0
                    timed = _timed(call)
                    if mode == "specfold":  # launched and folded (fold_launched=True, or the old default)
                        with fold_launched_calls():
                            timed["launched_folded_ms"] = time_launched(call)
                    host = []
                    for _ in range(10):
                        sync()
                        t0 = time.perf_counter()
                        call()
                        host.append(1e3 * (time.perf_counter() - t0))
                    sync()
                    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
                    with profile(activities=activities) as prof:
                        for _ in range(5):
                            call()
                        sync()
                    launches = sum(e.count for e in prof.key_averages()
                                   if "LaunchKernel" in e.key or "cuLaunch" in e.key) / 5
                    profiler = cProfile.Profile()
                    profiler.enable()
                    for _ in range(10):
                        call()
                    sync()
                    profiler.disable()
                text = io.StringIO()
                for order in ("tottime", "cumulative"):
                    pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(30)
                (out_dir() / f"launch_profile_{name}_{mode}_n{n_rows}.txt").write_text(
                    f"cProfile of 10 calls, {name}, {mode}, N = {n_rows}, prefix 512\n" + text.getvalue())
                rows.append({"model": name, "prefix": 512, "n_branches": n_rows, "mode": mode,
                             "recompute_ratio": s.recompute_ratio if s.layers else 1.0, "folded": bool(s.layers),
                             **timed, "host_ms": statistics.median(host), "launches_per_call": launches,
                             "fold_launched": args.fold_launched,
                             "first_call_s": first_s,
                             **({} if args.logit_fraction is None else {"logit_fraction": args.logit_fraction})})
            except Exception as exc:
                traceback.print_exc()
                rows.append({"model": name, "n_branches": n_rows, "mode": "error", "what": mode,
                             "error": repr(exc)[:300]})
            print(json.dumps(rows[-1]), flush=True)
        del model, cache, fns
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return rows


class _CallRecorder:
    """Wraps a verification callable: records (N, recompute ratio) of every call; decoding is unchanged."""

    def __init__(self, inner, base) -> None:
        self.inner, self.base, self.calls = inner, base, []
        self.config, self.prefill, self.write_block = base.config, base.prefill, base.write_block

    def __call__(self, tokens, parents, cache, logit_positions=None):
        with collect_stats() as s:
            out = self.inner(tokens, parents, cache, logit_positions=logit_positions)
        self.calls.append((tokens.shape[0], s))
        return out

    def ratios(self) -> list[tuple[int, float]]:
        return [(n, 1.0 if n == 1 or not s.layers else s.recompute_ratio) for n, s in self.calls]


def _latency_rows(args, name: str, ns: list[int], deadline: Deadline) -> list[dict]:
    """per_check rows at a real shape, prefix 512, for the Ns a decoding run used (with this run's
    SpecFold options, and dense under Inductor when not --no-inductor)."""
    sub = argparse.Namespace(**{**vars(args), "models": (name,), "ns": tuple(ns), "prefixes": (512,),
                                "ratios": None, "budget": deadline.left(), "specfold_no_inductor": False,
                                "specfold_graph_flags": False})
    return suite_per_check(sub)


def suite_end_to_end(args) -> list[dict]:
    """Vanilla / Spiffy / SpecFold decoding of the trained model on the task suite (real accuracy and
    tokens/s on this GPU), plus tokens/s PROJECTED to the 1.5B/7B shapes by replaying every run's
    verification calls (N, measured recompute ratio) through latencies measured in this run (or read
    from a per_check JSON with --latencies; see bench/project.py)."""
    from .project import LATENCIES, SHAPES, project_all
    from pathlib import Path

    from specfold_compile.decoding import generate
    from specfold_compile.loading import DEFAULT_MODEL_DIR, encode, load_model
    from specfold_compile.tasks import TASKS, sample, score_many

    deadline = Deadline(args.budget)
    model = load_model(None, device=DEVICE)
    graph_file = Path(DEFAULT_MODEL_DIR) / "draft_graph.json"
    graph = str(graph_file) if graph_file.is_file() else None
    options = {"tau": 0.1, "kernels": KERNELS, "min_spill_us": args.min_spill_us}
    # The default decides per call whether folding pays (on this tiny model it never does, so its calls
    # run the plain graph); fold_all folds every multi-branch call, which measures the recompute ratios
    # the projections to real shapes replay.
    # spiffy_compiled: Spiffy under torch.compile's default backend, the fair baseline for a compiled
    # SpecFold. Compiled modes compile the prefill and block writes too (generate(compile_writes=True)),
    # as a decode loop that compiles its model would.
    compiled = {"specfold": torch.compile(model, backend=specfold_backend, options=options),
                "specfold_fold_all": torch.compile(model, backend=specfold_backend,
                                                   options={**options, "fold_min_branches": 2}),
                "spiffy_compiled": torch.compile(model)}
    limit = min(args.limit, 10) if args.quick else args.limit
    rows = []
    modes = ("vanilla", "spiffy", "spiffy_compiled", "specfold", "specfold_fold_all")
    for task in TASKS:
        problems = sample(task, "test", limit, 0)
        prompts = [encode(model, prob.prompt).to(DEVICE) for prob in problems]
        targets = {mode: compiled.get(mode, model) for mode in modes}
        kws = {mode: dict(mode="vanilla" if mode == "vanilla" else "spiffy", max_new_tokens=96,
                          draft_budget=args.draft_budget, draft_graph=graph, compile_writes=mode in compiled)
               for mode in modes}
        recorders, warm_s = {}, {}
        for mode in modes:
            # Warm-up pass over every problem, recording each call's N and recompute ratio: compiles,
            # recompiles for new shapes and kernel autotuning all happen here, not in the timed passes.
            recorders[mode] = _CallRecorder(targets[mode], model)
            t0 = time.monotonic()
            for prompt in prompts:
                generate(recorders[mode], prompt, **kws[mode])
            warm_s[mode] = time.monotonic() - t0
        # Timed passes: the tiny model is host-bound, so one pass swings by +-30% run to run (H200,
        # session 5). Modes alternate problem by problem, and each problem's time is its median over
        # the repeats, so drift and jitter hit every mode alike.
        walls = {mode: [[] for _ in prompts] for mode in modes}
        results = {}
        for rep in range(args.repeats):
            for i, prompt in enumerate(prompts):
                for mode in modes:
                    res = generate(targets[mode], prompt, **kws[mode])
                    walls[mode][i].append(res.wall_time_s)
                    if rep == 0:
                        results.setdefault(mode, []).append(res)
        for mode in modes:
            res_list = results[mode]
            texts = [model.tokenizer.decode(r.tokens[:r.tokens.index(model.config.eos_token_id)]
                                            if model.config.eos_token_id in r.tokens else r.tokens,
                                            skip_special_tokens=True) for r in res_list]
            tokens = sum(len(r.tokens) for r in res_list)
            calls = sum(r.num_calls for r in res_list)
            accepted = sum(st.accepted for r in res_list for st in r.steps)
            nfe = sum(r.nfe for r in res_list)
            wall = sum(statistics.median(w) for w in walls[mode])
            acc = sum(score_many(problems, texts)) / len(problems)
            recorder = recorders[mode]
            call_ratios = recorder.ratios()
            ratio_draft = [st.recompute_ratio for n, st in recorder.calls if n > 1 and st.layers]  # folded calls
            rows.append({"task": task, "mode": mode, "accuracy": acc, "n": len(problems), "tokens": tokens,
                         "nfe": nfe / len(problems), "tokens_per_s": tokens / wall, "warmup_s": warm_s[mode],
                         "tokens_per_s_per_pass": [tokens / sum(w[r] for w in walls[mode]) for r in range(args.repeats)],
                         "accepted_per_call": accepted / max(calls, 1),
                         "recompute_ratio": (sum(ratio_draft) / len(ratio_draft)) if ratio_draft else None,
                         "folded_calls": sum(1 for _, st in recorder.calls if st.layers),
                         "compile_writes": kws[mode]["compile_writes"],
                         "kind": f"measured (trained 3.8M model, {_device_name()})"})
            print(json.dumps(rows[-1]), flush=True)
            rows[-1].update(forwards=nfe, calls=[(n, round(r, 4)) for n, r in call_ratios])
    ns = sorted({n for r in rows for n, _ in r["calls"]} | {1})
    latency_rows = json.loads(Path(args.latencies).read_text())["rows"] if args.latencies else []
    for shape in SHAPES if not args.latencies else ():
        if deadline.left() < 60:
            break
        latency_rows += _latency_rows(args, shape, ns, deadline)
    measured = list(rows)
    for latency in LATENCIES:  # CUDA-graph latencies, and launched ones where the rows have them
        rows += project_all(measured, latency_rows, 512, latency)
    for r in rows:
        if r.get("kind", "").startswith("projected"):
            print(json.dumps(r), flush=True)
    return rows


def suite_decode_loop(args) -> list[dict]:
    """generate() with CUDA-graph verification calls against launched ones (bench/decode_loop.py): the
    trained model's task suite, and ms per verification step at the --models shapes (default 1.5B)."""
    from .decode_loop import shape_rows, trained_rows, window_rows, write_rows

    rows = trained_rows(args, DEVICE, KERNELS, _device_name()) if "trained" in args.decode_parts else []
    if "shape" in args.decode_parts:
        rows += shape_rows(args, DEVICE, KERNELS, _device_name(), _model, args.models or MODELS[:1])
    if "writes" in args.decode_parts:
        rows += write_rows(args, DEVICE, _device_name(), _model, args.models or MODELS[:1])
    if "windows" in args.decode_parts:
        rows += window_rows(args, DEVICE, KERNELS, _device_name(), _model, args.models or MODELS[:1])
    return rows


SUITES = {"check": suite_check, "per_check": suite_per_check, "memory": suite_memory, "breakdown": suite_breakdown,
          "end_to_end": suite_end_to_end, "writes": suite_writes, "launch": suite_launch,
          "decode_loop": suite_decode_loop}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", action="append", choices=sorted(SUITES), required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for per_check")
    ap.add_argument("--no-inductor", dest="inductor", action="store_false")
    ap.add_argument("--specfold-no-inductor", action="store_true",
                    help="per_check: also time SpecFold with options['inductor']=False (ablation)")
    ap.add_argument("--specfold-graph-flags", action="store_true",
                    help="per_check: add SpecFold with options['gate_flags']='graph' (mode specfold_graph_flags)")
    ap.add_argument("--dense-fraction", type=float, default=SpecFoldSettings().dense_fraction,
                    help="SpecFold options['dense_fraction'] (default: the backend's)")
    ap.add_argument("--min-spill-us", type=float, default=SpecFoldSettings().min_spill_us,
                    help="SpecFold options['min_spill_us'] (per_check, breakdown, end_to_end; default: the backend's)")
    ap.add_argument("--fold-launched", action="store_true",
                    help="SpecFold with options['fold_launched']=True: launched calls (launched_ms, the launch "
                         "suite) fold too; by default they run the plain graph, CUDA-graph captures fold")
    ap.add_argument("--fold-min-branches", type=int, default=None,
                    help="SpecFold options['fold_min_branches'] (per_check; default None: the cost model)")
    ap.add_argument("--logit-fraction", type=_fraction, default=None,
                    help="per_check: logits of this fraction of the N x B positions only (logit_positions; the "
                         "decode loop asks for the masked ones, 59-62%% of a multi-branch call's); rows get "
                         "logit_fraction. Default: every position's")
    ap.add_argument("--combo-kernels", action="store_true",
                    help="per_check / breakdown: SpecFold with options['combo_kernels'] (Inductor combines "
                         "independent kernels into one launch; per_check rows get combo_kernels=true)")
    ap.add_argument("--fold-head", action="store_true", help="per_check: SpecFold with options['fold_head'] (its rows get fold_head=true)")
    ap.add_argument("--no-fuse-projections", dest="fuse_projections", action="store_false",
                    help="check / per_check / writes / memory / breakdown: models with q/k/v and gate/up as "
                         "separate GEMMs (the models' default fuses them); per_check rows get "
                         "fused_projections=false")
    ap.add_argument("--one-pass-max-prefix", type=int, default=None,
                    help="attention in one launch up to this many prefix keys (kernels.attention.ONE_PASS_MAX_PREFIX; "
                         "-1 = always prefix states + block merge, the ablation); per_check rows get the value")
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU, to test the suites")
    ap.add_argument("--models", type=lambda v: tuple(v.split(",")), default=None,
                    help=f"per_check / breakdown / writes: comma-separated subset of {','.join(MODELS)}")
    ap.add_argument("--ns", type=lambda v: tuple(int(x) for x in v.split(",")), default=None,
                    help=f"per_check: branch counts (default {','.join(map(str, PER_CHECK_NS))}); "
                         "breakdown: (default 17)")
    ap.add_argument("--prefixes", type=lambda v: tuple(int(x) for x in v.split(",")), default=None,
                    help="per_check, writes: prefix lengths (default 512,2048)")
    ap.add_argument("--ratios", type=lambda v: tuple(float(x) for x in v.split(",")), default=None,
                    help=f"per_check: target recompute ratios, a subset of {sorted(CHANGED_FOR_RATIO)} "
                         "(anything else is an error)")
    ap.add_argument("--breakdown-modes", type=lambda v: tuple(v.split(",")), default=("specfold",),
                    help="breakdown: profile these of dense,dense_compiled,specfold,specfold_no_inductor,"
                         "specfold_graph_flags")
    ap.add_argument("--limit", type=int, default=30, help="problems per task (end_to_end)")
    ap.add_argument("--latencies", default=None,
                    help="end_to_end: project through this per_check JSON instead of measuring latencies")
    ap.add_argument("--draft-budget", type=int, default=16, help="Spiffy D* (end_to_end)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="end_to_end: timed passes (modes alternate per problem; median per problem)")
    ap.add_argument("--decode-parts", type=lambda v: tuple(v.split(",")), default=("trained", "shape"),
                    help="decode_loop: trained (the task suite), shape (ms per step at --models), writes (one block "
                         "write at --models, dynamic vs static cache, launched vs replayed), windows (replayed "
                         "calls and writes at --models through attention windows vs the whole capacity of a "
                         "4096-key cache); "
                         "comma-separated")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.ratios or ()) - set(CHANGED_FOR_RATIO))
    if unknown:  # a filter that matches nothing would drop every SpecFold row without a word
        ap.error(f"--ratios: expected target ratios among {sorted(CHANGED_FOR_RATIO)}, got {unknown} "
                 "(the measured recompute ratios, e.g. 0.1875, are in the rows, not the targets)")
    if args.fold_head and args.logit_fraction is not None:  # its rows would say fold_head for a dense head
        ap.error("--fold-head with --logit-fraction: the head gate runs on every row; selected logits leave the "
                 "head dense")
    if args.cpu_dry_run:
        global DEVICE, KERNELS
        DEVICE, KERNELS = "cpu", "torch"
        tiny = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                    vocab_size=512, mask_token_id=511, eos_token_id=1, bos_token_id=0, max_position_embeddings=8192)
        SHAPE.update({name: tiny for name in MODELS})
    elif not torch.cuda.is_available():
        print("bench.run needs a CUDA device", file=sys.stderr)
        return 2
    if args.one_pass_max_prefix is not None:
        if args.one_pass_max_prefix < -1:
            ap.error(f"--one-pass-max-prefix: expected a prefix length >= -1, got {args.one_pass_max_prefix}")
        from specfold_compile.kernels import attention

        attention.ONE_PASS_MAX_PREFIX = args.one_pass_max_prefix
    from specfold_compile.arguments import UsageError, require_module

    try:  # the results directory and the plots' package, before the measurements, not after them
        out = out_dir("/tmp/specfold-bench-dry" if args.cpu_dry_run else "bench/results")
        if any(suite in PLOTS for suite in args.suite):
            require_module("matplotlib", "plotting the suites' results", "plot")
    except UsageError as e:
        ap.error(str(e))
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
        if suite in PLOTS and rows:
            print(f"== {suite}: plotted {plot_results(out / f'{suite}.json')}", flush=True)
        if suite == "check" and not all(r.get("ok") for r in rows):
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
