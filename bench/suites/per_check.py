"""The ``per_check`` suite: latency of one verification forward against the branch count: dense eager,
dense under Inductor, SpecFold at recompute ratios ~0.1/0.25/0.5, and the floor. Ablations
(--specfold-no-inductor, --specfold-graph-flags) add SpecFold modes with options["inductor"]=False or
options["gate_flags"]="graph". Rows carry ``ms`` (CUDA-graph replays) and ``launched_ms``."""

from __future__ import annotations

import json
import traceback

import torch

from specfold_compile.backend import collect_stats, fold_launched_calls, specfold_backend
from specfold_compile.reference import folded_verify

from ..common import Deadline, floor_ms
from ._context import CHANGED_FOR_RATIO, MODELS, PER_CHECK_NS, TAU, BenchContext, timed, tuning

SPECFOLD_FLAGS = ("dense_fraction", "min_spill_us", "fold_min_branches", "fold_launched", "combo_kernels")


def _reference_ratio(model, tokens, parents, cache) -> float:
    """The recompute ratio SPEC's gates decide on these inputs (reference implementation)."""
    with torch.no_grad():
        _, masks = folded_verify(model, tokens, parents, cache, TAU)
    draft = [m[1:] for m in masks]
    return sum(int((~m).sum()) for m in draft) / sum(m.numel() for m in draft)


def _compiled_modes(args, ctx: BenchContext, model):
    """SpecFold as the command line sets it up, the ablations asked for, and dense under Inductor."""
    options = {"tau": TAU, "kernels": ctx.kernels, "fold_head": args.fold_head,
               "tuning": tuning(args, *SPECFOLD_FLAGS)}
    folded = torch.compile(model, backend=specfold_backend, options=options)
    # Ablations, each its own mode: the rewritten graph without the default Inductor lowering on CUDA;
    # the gate's fold flags computed in the graph (options["gate_flags"]="graph").
    folded_plain = torch.compile(model, backend=specfold_backend, options={**options, "inductor": False}) \
        if args.specfold_no_inductor else None
    folded_graph_flags = torch.compile(model, backend=specfold_backend, options={**options, "gate_flags": "graph"}) \
        if args.specfold_graph_flags else None
    inductor = torch.compile(model.verify, dynamic=True) if args.inductor else None
    return folded, folded_plain, folded_graph_flags, inductor


def run(args, ctx: BenchContext) -> list[dict]:
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
        model = ctx.model(args, name)
        cfg = model.config
        folded, folded_plain, folded_graph_flags, inductor = _compiled_modes(args, ctx, model)
        for prefix in prefixes:
            cache = ctx.prefix(model, prefix, 1)
            for n_rows in ns:
                if deadline.left() < 20:
                    print("per_check: time budget reached, stopping", flush=True)
                    return rows
                base = {"model": name, "prefix": prefix, "n_branches": n_rows,
                        **({} if args.fuse_projections else {"fused_projections": False}),
                        **({} if args.one_pass_max_prefix is None
                           else {"one_pass_max_prefix": args.one_pass_max_prefix}),
                        **({} if args.logit_fraction is None else {"logit_fraction": args.logit_fraction})}
                tokens, parents = ctx.inputs(model, n_rows, 4, n_rows, cache)
                # the decode loop asks for the masked positions' logits only (--logit-fraction of the rows)
                logits_at = ctx.logit_positions(n_rows, cfg.block_size, args.logit_fraction, n_rows)
                logit_rows = None if logits_at is None else logits_at.numel()
                try:
                    with torch.no_grad():
                        times = timed(lambda: model.verify(tokens, parents, cache, logits_at))
                    add({**base, "mode": "dense", "recompute_ratio": 1.0, **times})
                    add({**base, "mode": "floor", "recompute_ratio": 1.0, "cuda_graph": False,
                         "ms": floor_ms(cfg, n_rows, n_rows * cfg.block_size, prefix, logit_rows)})
                    if inductor is not None:
                        try:
                            with torch.no_grad():
                                _, compile_s = ctx.first_call(lambda: inductor(tokens, parents, cache, logits_at))
                                times = timed(lambda: inductor(tokens, parents, cache, logits_at))
                            add({**base, "mode": "dense_compiled", "recompute_ratio": 1.0, **times,
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
                            _, first_s = ctx.first_call(lambda: folded(tokens, parents, cache, logits_at))
                            times = timed(lambda: folded(tokens, parents, cache, logits_at))
                        add({**base, "mode": "specfold", "recompute_ratio": 1.0, **times, "first_call_s": first_s})
                        continue
                    for target, changed in ratios.items():
                        tokens, parents = ctx.inputs(model, n_rows, changed, 100 * n_rows + changed, cache)
                        # the gate's decisions on these inputs (launched: folded even where launched calls
                        # run the plain graph, fold_launched=False; the CUDA-graph capture below folds)
                        with torch.no_grad(), collect_stats() as s, fold_launched_calls():
                            _, first_s = ctx.first_call(lambda: folded(tokens, parents, cache, logits_at))
                        first_call_s = {"specfold": first_s}
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
                                    _, first_call_s[mode] = ctx.first_call(
                                        lambda: fn(tokens, parents, cache, logits_at))
                                times = timed(lambda: fn(tokens, parents, cache, logits_at))
                            add({**base, "mode": mode, "recompute_ratio": ratio, **times,
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
        ctx.empty_cache()
    return rows
