"""The ``decode_loop`` suite: ``generate`` with CUDA-graph verification calls against launched ones.

* The trained model on the task suite (``--limit`` problems a task): real tokens/s of each mode with
  launched calls and with ``cuda_graphs`` (one ``VerifyGraphs`` a mode, kept across problems), accuracy,
  and the share of problems whose tokens equal the launched loop's (SpecFold's captured calls fold while
  its launched ones run the plain graph, so its tokens may differ there; every other mode must agree).
* Block writes at real shapes (``write_rows``): launched on the dynamic cache against the static cache's
  in-place write, launched and replayed, eager and compiled.
* Attention windows (``window_rows``): a 512-token prefix in a static cache of 4096 keys (what a
  generation of 3584 tokens allocates), each replayed call and block write reading a window of the cache
  (``VerifyGraphs(windows=256)``, the default) against the whole capacity (``windows=None``).
* Real shapes (``--models``, random bf16 weights, a 512-token prefix in a static cache of 768 keys):
  one decode step's verification call as ``generate`` makes it (``decoder._verify``: inputs from the
  host, the masked positions' logits, confidences back to the host), launched and replayed from a CUDA
  graph, at N = 1, 9 and 17, for Spiffy under Inductor and SpecFold; and the static cache's logits
  against the dynamic cache's (eager model). Random weights decode nothing meaningful, so these rows are
  per-call costs with the loop's own transfers, not a decoding speed.

Warm-up passes (compiles, autotuning, captures) are timed apart from the timed passes.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from specfold_compile.backend import collect_stats, fold_launched_calls, specfold_backend
from specfold_compile.decoding import VerifyGraphs, generate

from ..common import draft_tokens, draft_tree, time_launched
from ._context import MODELS, BenchContext, tuning

LOOPS = ("launched", "cuda_graphs")
TAU = 0.3  # per_check's: with 6 of 32 positions changed, recompute ratio ~0.19


def _allow_many_graphs() -> None:
    """Several backends compile the same ``forward`` here, each for a dynamic and a static cache and for
    N = 1 and N > 1: more than Dynamo's default 8 entries per code object, past which it runs the
    frame eager without a compile."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)


def _graphs(target, device: str) -> VerifyGraphs:
    return VerifyGraphs(target, replay="cuda" if device == "cuda" else "eager")


def trained_rows(args, device: str, kernels: str, device_name: str) -> list[dict]:
    from specfold_compile.loading import DEFAULT_MODEL_DIR, encode, load_model
    from specfold_compile.tasks import TASKS, sample, score_many

    from pathlib import Path

    _allow_many_graphs()
    model = load_model(None, device=device)
    graph_file = Path(DEFAULT_MODEL_DIR) / "draft_graph.json"
    draft_graph = str(graph_file) if graph_file.is_file() else None
    options = {"tau": 0.1, "kernels": kernels, "tuning": tuning(args)}
    targets = {"vanilla": model, "spiffy": model, "spiffy_compiled": torch.compile(model),
               "specfold": torch.compile(model, backend=specfold_backend, options=options),
               "specfold_fold_all": torch.compile(model, backend=specfold_backend,
                                                  options={**options, "tuning": tuning(args, fold_min_branches=2)})}
    graphs = {mode: _graphs(target, device) for mode, target in targets.items()}
    limit = min(args.limit, 5) if args.quick else args.limit
    rows = []
    for task in TASKS:
        problems = sample(task, "test", limit, 0)
        prompts = [encode(model, prob.prompt).to(device) for prob in problems]

        def run(mode, loop, prompt):
            return generate(targets[mode], prompt, mode="vanilla" if mode == "vanilla" else "spiffy",
                            max_new_tokens=96, draft_budget=args.draft_budget, draft_graph=draft_graph,
                            compile_writes=mode not in ("vanilla", "spiffy"),
                            cuda_graphs=graphs[mode] if loop == "cuda_graphs" else False)

        warm_s, captures = {}, {}
        for mode in targets:
            for loop in LOOPS:
                t0 = time.monotonic()
                captured = sum(run(mode, loop, p).graph_captures for p in prompts)
                warm_s[mode, loop], captures[mode, loop] = time.monotonic() - t0, captured
        walls = {key: [[] for _ in prompts] for key in warm_s}
        results: dict = {}
        for rep in range(args.repeats):  # modes and loops alternate problem by problem (drift hits all alike)
            for i, prompt in enumerate(prompts):
                for key in walls:
                    res = run(*key, prompt)
                    walls[key][i].append(res.wall_time_s)
                    if rep == 0:
                        results.setdefault(key, []).append(res)
        eos = model.config.eos_token_id
        for (mode, loop), res_list in results.items():
            texts = [model.tokenizer.decode(r.tokens[:r.tokens.index(eos)] if eos in r.tokens else r.tokens,
                                            skip_special_tokens=True) for r in res_list]
            tokens = sum(len(r.tokens) for r in res_list)
            wall = sum(statistics.median(w) for w in walls[mode, loop])
            same = [a.tokens == b.tokens for a, b in zip(res_list, results[mode, "launched"])]
            rows.append({"part": "trained", "task": task, "mode": mode, "loop": loop, "n": len(problems),
                         "tokens": tokens, "tokens_per_s": tokens / wall,
                         "accuracy": sum(score_many(problems, texts)) / len(problems),
                         "nfe": sum(r.nfe for r in res_list) / len(problems),
                         "same_tokens_as_launched": sum(same) / len(same),
                         "warmup_s": warm_s[mode, loop], "graph_captures": captures[mode, loop],
                         "kind": f"measured (trained 3.8M model, {device_name})"})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _masked_rows(cfg, n_rows: int, changed: int, seed: int) -> tuple[torch.Tensor, list[int]]:
    """CPU rows of a decode step: a main block with its last 60% masked (the loop's share of logits) and
    drafts each changing ``changed`` positions of their parent (``bench.common.draft_tokens``)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = min(cfg.vocab_size, 30000)
    main = torch.randint(0, vocab, (cfg.block_size,), generator=gen)
    main[round(0.4 * cfg.block_size):] = cfg.mask_token_id
    parents = draft_tree(n_rows)
    return draft_tokens(main, parents, changed, vocab, gen), parents


def _call_inputs(cfg, n_rows: int, device: str):
    """A decode step's CPU rows and parents (``_masked_rows``, seed ``n_rows``) and, on ``device``, the
    tokens, parents and masked positions a model call takes."""
    cpu_rows, parents = _masked_rows(cfg, n_rows, 6, n_rows)
    positions = (cpu_rows == cfg.mask_token_id).flatten().nonzero().flatten().to(device)
    return cpu_rows, parents, cpu_rows.to(device), torch.tensor(parents, device=device), positions


def _prefilled(model, device: str, seed: int):
    """``model``, its dynamic cache after a random 512-token prompt, and a random block to write next."""
    gen = torch.Generator().manual_seed(seed)
    vocab = min(model.config.vocab_size, 30000)
    dyn = model.prefill(torch.randint(0, vocab, (512,), generator=gen).to(device))
    return model, dyn, torch.randint(0, vocab, (model.config.block_size,), generator=gen).to(device)


def _compiled_targets(args, model, kernels: str) -> dict:
    """The decode-step rows' targets: Spiffy under Inductor and SpecFold (tau 0.3: r ~0.19 on these drafts)."""
    return {"spiffy_compiled": torch.compile(model),
            "specfold": torch.compile(model, backend=specfold_backend, options={"tau": TAU, "kernels": kernels,
                                                                          "tuning": tuning(args)})}


def _agreement(name: str, a, b, masked) -> dict:
    """Confidence and argmax agreement of two ``_verify`` results (conf, tok) at the masked positions."""
    return {f"max_conf_diff_vs_{name}": float((a[0] - b[0])[masked].abs().max()),
            f"tokens_agree_vs_{name}": float((a[1] == b[1])[masked].float().mean())}


def shape_rows(args, device: str, kernels: str, device_name: str, build_model, models) -> list[dict]:
    """One decode step's verification call as ``generate`` makes it (``decoder._verify``: rows and parents
    from the host, logits of the masked positions, confidences back to the host), launched and replayed,
    at N = 1, 9 and 17 with drafts changing 6 of 32 positions (recompute ratio ~0.19 at tau = 0.3, as
    per_check's 0.25 target). Both loops read a static cache of 768 keys holding a 512-token prefix
    (what ``generate`` allocates for 256 new tokens; replayed calls read its 512-key
    window), so each mode compiles once; the eager model checks the static cache against the dynamic
    one at this shape (bf16)."""
    from specfold_compile.decoding.decoder import _verify

    _allow_many_graphs()
    rows = []
    for name in models:
        model, dyn, _ = _prefilled(build_model(args, name), device, seed=0)
        cfg = model.config
        targets = _compiled_targets(args, model, kernels)
        # the static cache against the dynamic one, eager model, N = 17
        _, _, tokens, parent_ids, positions = _call_inputs(cfg, 17, device)
        check = VerifyGraphs(model, replay="eager")
        static = check.attach(dyn, 512 + 256)
        ref = model(tokens, parent_ids, dyn, logit_positions=positions).float()
        out = model(tokens, parent_ids, static, logit_positions=positions).float()
        rows.append({"part": "shape_check", "model": name, "prefix": 512, "capacity": static.capacity,
                     "rel_err_static_vs_dynamic": float((out - ref).norm() / ref.norm()),
                     "argmax_agree": float((out.argmax(-1) == ref.argmax(-1)).float().mean())})
        print(json.dumps(rows[-1]), flush=True)
        del check, static, ref, out
        for mode, target in targets.items():
            graphs = _graphs(target, device)
            cache = graphs.attach(dyn, 512 + 256)
            for n_rows in (1, 9, 17):
                cpu_rows, parents = _masked_rows(cfg, n_rows, 6, n_rows)
                ratio, folded_launched = None, None
                if mode == "specfold" and n_rows > 1:
                    with fold_launched_calls(), collect_stats() as s:
                        folded_launched = _verify(target, cpu_rows, parents, cache, cfg.mask_token_id, False)
                    ratio = s.recompute_ratio if s.layers else None
                t0 = time.monotonic()
                launched = _verify(target, cpu_rows, parents, cache, cfg.mask_token_id, False)
                first_s = time.monotonic() - t0
                t0 = time.monotonic()
                replayed = _verify(target, cpu_rows, parents, cache, cfg.mask_token_id, False, graphs)
                capture_s = time.monotonic() - t0
                row = {"part": "shape", "model": name, "prefix": 512, "capacity": cache.capacity, "mode": mode,
                       "n_branches": n_rows, "logit_rows": int((cpu_rows == cfg.mask_token_id).sum()),
                       "recompute_ratio": ratio, "first_launched_s": first_s, "capture_s": capture_s,
                       # each call returns its confidences on the host: waited for, as the loop waits
                       "launched_ms": time_launched(lambda: _verify(target, cpu_rows, parents, cache,
                                                                    cfg.mask_token_id, False), calls=20),
                       "cuda_graph_ms": time_launched(lambda: _verify(target, cpu_rows, parents, cache,
                                                                      cfg.mask_token_id, False, graphs), calls=20),
                       "kind": f"measured (random bf16 weights, {device_name})"}
                # Over the masked positions (the others are the mask token in both). Replayed against
                # launched: for SpecFold a folded replay against the plain graph (folding's difference);
                # against the same call launched folded, what the capture itself could change.
                masked = cpu_rows == cfg.mask_token_id
                row.update(_agreement("launched", replayed, launched, masked))
                if folded_launched is not None:
                    row.update(_agreement("folded_launched", replayed, folded_launched, masked))
                rows.append(row)
                print(json.dumps(row), flush=True)
        del model, targets, dyn
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def write_rows(args, device: str, device_name: str, build_model, models) -> list[dict]:
    """One block write at real shapes (random bf16 weights, 32 tokens after a 512-token prefix) as the
    decode loop makes it: on the dynamic cache (``append_block``: the prefix K/V copied by ``torch.cat``),
    eager and compiled (Inductor), launched; on a static cache of 768 keys (``append_block_static``: the
    block's K/V written in place, attention over the whole capacity, masked), launched
    (``model.write_block``) and replayed from a CUDA graph (``VerifyGraphs.write_block``, through a
    768-key window here: it reads the smallest 256 x 2^k keys holding prefix and
    block), eager and compiled. Each timed static call is followed by a reset of the cache's length (one
    small fill), so every call writes the same block at prefix 512. Every write's seed logits and K/V
    are compared with the dynamic eager write's."""
    rows = []
    for name in models:
        torch._dynamo.reset()
        model, dyn, block = _prefilled(build_model(args, name), device, seed=1)
        cfg = model.config
        ref = model.write_block(dyn, block)
        for compiled in (False, True):
            graphs = _graphs(model, device)
            static = graphs.attach(dyn, 512 + 256)

            def reset():
                static.device_length.fill_(512)
                static.static_length = 512

            calls = {"dynamic_launched": lambda: model.write_block(dyn, block, compiled=compiled),
                     "static_launched": lambda: (model.write_block(static, block, compiled=compiled), reset()),
                     "static_cuda_graph": lambda: (graphs.write_block(static, block, compiled), reset())}
            for kind, fn in calls.items():
                t0 = time.monotonic()
                fn()
                first_s = time.monotonic() - t0
                fn()
                written = model.write_block(dyn, block, compiled=compiled) if kind == "dynamic_launched" else static
                row = {"part": "write", "model": name, "prefix": 512, "capacity": static.capacity,
                       "block": cfg.block_size, "write": kind, "compiled": compiled, "first_call_s": first_s,
                       "ms": time_launched(fn, calls=20),
                       "kind": f"measured (random bf16 weights, {device_name})"}
                # (a static cache holds the block the last timed call wrote at prefix 512)
                out = written.next_logits.float()
                row["rel_err_next_logits_vs_dynamic_eager"] = float(
                    (out - ref.next_logits.float()).norm() / ref.next_logits.float().norm())
                row["rel_err_kv_vs_dynamic_eager"] = max(
                    float((a[:, :512 + cfg.block_size].float() - b.float()).norm() / b.float().norm())
                    for a, b in zip((*written.keys, *written.values), (*ref.keys, *ref.values)))
                rows.append(row)
                print(json.dumps(row), flush=True)
        del model, dyn, ref
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def window_rows(args, device: str, kernels: str, device_name: str, build_model, models,
                capacity: int = 4096) -> list[dict]:
    """Replayed decode-step calls (N = 1, 9, 17; Spiffy under Inductor and SpecFold, as ``shape_rows``)
    and block writes (eager) with a 512-token prefix in a static cache of ``capacity`` keys: through
    attention windows (``VerifyGraphs``' default, 256 keys doubling: a 512-key window here) against the
    whole capacity (``windows=None``). Each windowed result is compared with the whole-capacity one."""
    from specfold_compile.decoding.cuda_graphs import CAPACITY_STEP
    from specfold_compile.decoding.decoder import _verify

    _allow_many_graphs()
    rows = []
    for name in models:
        torch._dynamo.reset()
        model, dyn, block = _prefilled(build_model(args, name), device, seed=0)
        cfg = model.config
        # The eager model's logits (N = 9, masked positions) through the window and on the dynamic cache
        # against the whole capacity: how far reading fewer keys moves them (bf16 reduction order).
        check = VerifyGraphs(model, replay="eager")
        whole_cache = check.attach(dyn, capacity)
        _, _, tokens, parent_ids, positions = _call_inputs(cfg, 9, device)
        ref = model(tokens, parent_ids, whole_cache, logit_positions=positions).float()
        row = {"part": "window_check", "model": name, "prefix": 512, "capacity": capacity, "n_branches": 9}
        for label, other in (("window", check.window(512)[1]), ("dynamic", dyn)):
            out = model(tokens, parent_ids, other, logit_positions=positions).float()
            row[f"rel_err_{label}_vs_whole"] = float((out - ref).norm() / ref.norm())
            row[f"argmax_agree_{label}_vs_whole"] = float((out.argmax(-1) == ref.argmax(-1)).float().mean())
        rows.append(row)
        print(json.dumps(row), flush=True)
        del check, whole_cache, ref, out
        targets = {**_compiled_targets(args, model, kernels), "eager_writes": model}
        for mode, target in targets.items():
            whole = {}
            for windows in (None, CAPACITY_STEP):
                graphs = VerifyGraphs(target, replay="cuda" if device == "cuda" else "eager", windows=windows)
                cache = graphs.attach(dyn, capacity)
                base = {"part": "window", "model": name, "prefix": 512, "capacity": capacity, "mode": mode,
                        "windows": windows, "kind": f"measured (random bf16 weights, {device_name})"}
                if mode == "eager_writes":
                    def write():
                        graphs.write_block(cache, block)
                        cache.device_length.fill_(512)
                        cache.static_length = 512

                    write()
                    row = {**base, "n_branches": None, "window": graphs.window_keys(512 + cfg.block_size),
                           "cuda_graph_ms": time_launched(write, calls=20)}
                    out = cache.next_logits.float()
                    if windows is None:
                        whole["write"] = out
                    else:
                        row["rel_err_vs_whole"] = float((out - whole["write"]).norm() / whole["write"].norm())
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    continue
                for n_rows in (1, 9, 17):
                    cpu_rows, parents = _masked_rows(cfg, n_rows, 6, n_rows)
                    out = _verify(target, cpu_rows, parents, cache, cfg.mask_token_id, False, graphs)  # captures
                    row = {**base, "n_branches": n_rows, "window": graphs.window_keys(512),
                           "cuda_graph_ms": time_launched(lambda: _verify(target, cpu_rows, parents, cache,
                                                                          cfg.mask_token_id, False, graphs), calls=20)}
                    if windows is None:
                        whole[n_rows] = out
                    else:
                        row.update(_agreement("whole", out, whole[n_rows], cpu_rows == cfg.mask_token_id))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                del graphs, cache
        del model, targets, dyn
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def run(args, ctx: BenchContext) -> list[dict]:
    """generate() with CUDA-graph verification calls against launched ones: the trained model's task
    suite, and ms per verification step at the --models shapes (default the 1.5B); --decode-parts."""
    models = args.models or MODELS[:1]
    rows = trained_rows(args, ctx.device, ctx.kernels, ctx.device_name()) if "trained" in args.decode_parts else []
    if "shape" in args.decode_parts:
        rows += shape_rows(args, ctx.device, ctx.kernels, ctx.device_name(), ctx.model, models)
    if "writes" in args.decode_parts:
        rows += write_rows(args, ctx.device, ctx.device_name(), ctx.model, models)
    if "windows" in args.decode_parts:
        rows += window_rows(args, ctx.device, ctx.kernels, ctx.device_name(), ctx.model, models)
    return rows
