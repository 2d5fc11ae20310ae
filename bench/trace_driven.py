"""Trace-driven end-to-end decoding at real shapes: the shipped model's decodes replayed, step for step,
on random-weight models of the 1.5B / 7B / NLD-3B shapes, every forward, write, copy and host step timed.

Random weights decode nothing meaningful, so the decisions come from a record. ``record`` decodes
task-suite prompts with the shipped model in the device loop (``generate(loop="device")``'s loop) and
keeps every step's outcome (``decoding.step_forcing``): vanilla, and Spiffy's calls through the
SpecFold-compiled forward at ``--tau`` with each gate's fold mask. ``replay`` runs the same device loop
at a real shape with those outcomes forced inside each step (so inside its CUDA graph) and those fold
masks forced on each gate (P4: given its masks, a folded call's work is fixed): the same calls, rows,
parents, accepted drafts, block writes and tokens as the record, with the real shape's forward,
bookkeeping and writes. Each row says whether the replay reproduced the record's call sequence
(``trace_reproduced``). The modes (all in the device loop; with CUDA graphs on CUDA):

    vanilla          the recorded vanilla decode, the eager model
    spiffy           the recorded Spiffy/SpecFold decode, the eager model (no folding)
    spiffy_compiled  the same calls, the model compiled by Inductor (dense)
    specfold         the same calls, the model compiled by the SpecFold backend, the recorded masks forced
    specfold_heads   as specfold, each layer's packed linears with their own cuBLAS head (``Tuning``'s
                     ``dense_fraction`` as a profile): ``fold_masks.dense_fractions`` over another
                     record's masks (``--heads-from``, e.g. one of train-split prompts), at ``--heads-quantile``;
                     or, with ``--dense-fraction F``, one head of F of the rows for every layer

so the speculative modes make exactly the same calls and differ only in how a call is computed.
The record's model has 6 layers: gate ``g`` of a real-shape model takes the recorded mask of gate
``g * 6 // layers``. The record is a Fast-dLLM v2 decode; a model of the other family (NLD-3B) lays a
prompt out alike only when it fills whole blocks, so it replays a record made with ``--grid`` (prompts
left-padded with the pad token to whole blocks). ``--fuse-boundaries`` records (and so replays)
``generate(fuse_boundaries=True)``'s loop (``--fuse-boundaries writes``: ``fuse_boundaries="writes"``'s);
an NLD model cannot replay such a record (it has no seed prediction, ``generate``'s docstring). Rows as
``bench.end_to_end``'s, with ``trace_driven`` True and ``fuse_boundaries`` and ``draft_budget`` from the record::

    python -m bench.trace_driven record --out TRACE.pt [--limit 4] [--tasks math,code,instruct] [--tau 0.1] [--grid]
        [--fuse-boundaries [writes]] [--split test|train] [--draft-budget 16]
    python -m bench.trace_driven replay --trace TRACE.pt --device cuda --models fast-dllm-v2-1.5b [--out FILE]
        [--modes ...,specfold_heads (--heads-from TRAIN_TRACE.pt [--heads-quantile 0.9] | --dense-fraction F)]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import time
from pathlib import Path

import torch

from bench.common import check_output, freeze_collector, write_json
from bench.end_to_end import _Clock, _plain_pass, _row, _targets, _timed_run

MODES = ("vanilla", "spiffy", "spiffy_compiled", "specfold")
ON_REQUEST = ("specfold_heads",)  # needs --heads-from
RECORDED = {"vanilla": "vanilla", "spiffy": "spiffy", "spiffy_compiled": "spiffy", "specfold": "spiffy",
            "specfold_heads": "spiffy"}


def _decode(model, prompt, mode, args, graph, forward=None, trace=None, graphs=None):
    from specfold_compile.decoding.defaults import DEFAULTS
    from specfold_compile.decoding.device_loop import decode_on_device

    return decode_on_device(model, prompt, mode, args.max_new_tokens, DEFAULTS.threshold,
                            args.draft_budget if mode != "vanilla" else 0,
                            graph if mode != "vanilla" else None, True, graphs=graphs, forward=forward, trace=trace,
                            fuse_boundaries=args.fuse_boundaries, compile_writes=args.compile_writes,
                            all_logits=args.all_logits)


def _heads_fields(args) -> dict:
    """What a ``specfold_heads`` row says of its heads: the profile, its record and quantile (``--heads-from``),
    or the one fraction of every layer (``--dense-fraction``)."""
    if args.dense_fraction is not None:
        return {"dense_fraction": args.dense_fraction, "heads_from": None}
    return {"dense_fraction": list(args.heads), "heads_from": args.heads_from, "heads_quantile": args.heads_quantile}


def record(args) -> dict:
    """The shipped model's device-loop decodes of the task-suite prompts: every step's outcome (and, for
    the speculative decode, every gate's fold mask)."""
    from specfold_compile.backend import SpecFoldBackend, fold_launched_calls
    from specfold_compile.decoding.graph import load_draft_graph
    from specfold_compile.decoding.step_forcing import StepRecorder
    from specfold_compile.loading import DEFAULT_MODEL_DIR, encode, load_model
    from specfold_compile.ops.fold_masks import recorded_fold_masks
    from specfold_compile.tasks import sample

    model = load_model(None, device=args.device)
    cfg = model.config
    graph = load_draft_graph(str(DEFAULT_MODEL_DIR / "draft_graph.json"), cfg.block_size)
    kernels = "triton" if args.device == "cuda" else "torch"
    folded = torch.compile(model, backend=SpecFoldBackend(tau=args.tau, kernels=kernels, fold_min_branches=2))
    prompts = []
    for task in args.tasks:
        for problem in sample(task, args.split, args.limit, 0):
            prompt = encode(model, problem.prompt)
            if args.grid:  # whole blocks: both families' layouts agree (decoding/prompt_layout.py)
                pad = -prompt.numel() % cfg.block_size
                prompt = torch.cat([torch.full((pad,), cfg.pad_token_id, dtype=prompt.dtype), prompt])
            prompt = prompt.to(args.device)
            entry = {"task": task, "prompt": prompt.cpu()}
            for kind, forward in (("vanilla", None), ("spiffy", folded)):
                with fold_launched_calls(), recorded_fold_masks() as masks:
                    trace = StepRecorder(masks)
                    res = _decode(model, prompt, kind, args, graph, forward=forward, trace=trace)
                entry[kind] = {"steps": trace.steps, "seeds": trace.seeds, "tokens": res.tokens, "nfe": res.nfe}
            prompts.append(entry)
            print(f"recorded {task} prompt {len(prompts)}: vanilla nfe {entry['vanilla']['nfe']}, "
                  f"speculative nfe {entry['spiffy']['nfe']}", flush=True)
    return {"model": "specfold-tiny", "tau": args.tau, "max_new_tokens": args.max_new_tokens,
            "draft_budget": args.draft_budget, "layers": cfg.num_layers, "mask_token_id": cfg.mask_token_id,
            "eos_token_id": cfg.eos_token_id, "vocab_size": cfg.vocab_size, "block_size": cfg.block_size,
            "family": cfg.family, "grid": args.grid, "fuse_boundaries": args.fuse_boundaries, "split": args.split,
            "prompts": prompts}


def head_profile(trace: dict, quantile: float) -> tuple[float, ...]:
    """``fold_masks.dense_fractions`` over every folded call of ``trace``'s speculative decodes: a head
    fraction a recorded gate (the replay spreads them over its layers, as it does the masks)."""
    from specfold_compile.ops.fold_masks import dense_fractions

    pairs = [(g, step.masks[g]) for p in trace["prompts"] for step in p["spiffy"]["steps"]
             if step.masks is not None for g in range(step.masks.shape[0])]
    return dense_fractions(pairs, quantile=quantile)


def token_map(trace: dict, cfg) -> torch.Tensor:
    """The record's token ids in ``cfg``'s vocabulary: mask and eos to the model's own, the others onto
    ids that are neither."""
    special = {cfg.mask_token_id, cfg.eos_token_id}
    free = [i for i in range(trace["vocab_size"] + len(special) + 4) if i not in special][:trace["vocab_size"]]
    table = torch.tensor(free, dtype=torch.long)
    table[trace["mask_token_id"]] = cfg.mask_token_id
    table[trace["eos_token_id"]] = cfg.eos_token_id
    return table


def replay(args, trace: dict, name: str) -> list[dict]:
    """Every mode's replay of ``trace`` on a random bf16 model of preset ``name``."""
    from specfold_compile.decoding import VerifyGraphs
    from specfold_compile.decoding.graph import load_draft_graph
    from specfold_compile.loading import DEFAULT_MODEL_DIR
    from specfold_compile.decoding.step_forcing import StepForcing
    from specfold_compile.models import build
    from specfold_compile.ops.fold_masks import forced_fold_masks

    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    model = build(name, device=args.device, dtype=dtype, seed=0, **args.override)
    cfg = model.config
    if cfg.block_size != trace["block_size"]:
        raise SystemExit(f"--models {name}: block size {cfg.block_size}, the record's is {trace['block_size']}")
    if cfg.family != trace["family"] and not trace["grid"]:
        raise SystemExit(f"--models {name}: a {cfg.family} model lays prompts out unlike the record's "
                         f"{trace['family']}; replay a record made with --grid")
    args.fuse_boundaries = trace.get("fuse_boundaries", False)  # the record's loop: False, True or "writes"
    if args.fuse_boundaries and not cfg.shift_logits:
        raise SystemExit(f"--models {name}: the record verifies blocks with their writes (--fuse-boundaries), which "
                         f"a {cfg.family} model cannot (no seed prediction); replay a record made without it")
    table = token_map(trace, cfg)
    # the record's draft graph: each step builds its drafts (then replaced by the record's) as the record did
    graph = load_draft_graph(str(DEFAULT_MODEL_DIR / "draft_graph.json"), cfg.block_size)
    prompts = trace["prompts"]
    targets = _targets(model, [m for m in args.modes if m not in ON_REQUEST], args.device, trace["tau"])
    if "specfold_heads" in args.modes:  # a compiled model of its own: its graphs differ in the heads alone
        targets["specfold_heads"] = torch.compile(model, backend="specfold", options={
            "tau": trace["tau"], "dense_fraction": args.heads, **({} if cuda else {"kernels": "torch"})})
    rows, clock = [], _Clock(cuda)
    for mode in args.modes:
        kind = RECORDED[mode]
        offsets, steps, seeds = [], [], []
        for p in prompts:
            offsets.append((len(steps), len(seeds)))
            steps, seeds = steps + p[kind]["steps"], seeds + p[kind]["seeds"]
        forcing = StepForcing(steps, seeds, torch.device(args.device), table, gates=cfg.num_layers)
        graphs = VerifyGraphs(targets[mode], replay="cuda" if cuda else "eager") if cuda or args.eager_graphs else None
        mapped = [table[p["prompt"]].to(args.device) for p in prompts]

        def run(i: int) -> dict:
            forcing.seek(*offsets[i])

            def decode(model_, prompt, cuda_graphs=None, **_):
                return _decode(model_, prompt, kind, args, graph, trace=forcing,
                               graphs=cuda_graphs if cuda_graphs is not False else None)
            out = _timed_run(targets[mode], mapped[i], clock, graphs, {}, decode=decode)
            rec = prompts[i][kind]
            out["reproduced"] = (out["tokens"] == table[torch.tensor(rec["tokens"], dtype=torch.long)].tolist()
                                 and out["nfe"] == rec["nfe"] and out["calls"] == _recorded_calls(rec["steps"]))
            return out
        def forced_decode(i: int):
            forcing.seek(*offsets[i])
            return _decode(targets[mode], mapped[i], kind, args, graph, trace=forcing, graphs=graphs)

        with forced_fold_masks(forcing.fold_masks):
            t0 = time.perf_counter()
            for i in range(len(prompts)):  # warm-up: compiles, captures, autotuning
                run(i)
            warm_s = time.perf_counter() - t0
            if args.freeze_gc:
                freeze_collector()
            runs = {mode: [[run(i) for _ in range(args.repeats)] for i in range(len(prompts))]}
            by_task: dict[str, list[int]] = {}
            for i, p in enumerate(prompts):
                by_task.setdefault(p["task"], []).append(i)
            plain = {task: [_plain_pass([functools.partial(forced_decode, i) for i in idx], clock)
                            for _ in range(args.repeats)] for task, idx in by_task.items()}
            if args.profile:
                _profiled_pass([functools.partial(forced_decode, i) for i in range(len(prompts))], clock,
                               Path(args.profile) / f"prof_{name}_{mode}.txt")
        for task, idx in by_task.items():
            spec = "specfold" if mode in ON_REQUEST else mode  # the base mode, as bench.end_to_end names it
            row = _row(name, task, spec, {spec: [runs[mode][i] for i in idx]}, warm_s, cuda, plain[task])
            row["mode"] = mode
            row.update(trace_driven=True, fuse_boundaries=args.fuse_boundaries, compile_writes=args.compile_writes,
                       freeze_gc=args.freeze_gc, all_logits=args.all_logits,
                       **(_heads_fields(args) if mode == "specfold_heads" else {}),
                       loop="device", host_twin=None,
                       same_as_host_twin=None, tokens_match=None,
                       trace_reproduced=all(r["reproduced"] for i in idx for r in runs[mode][i]),
                       draft_budget=args.draft_budget,
                       record={"model": trace["model"], "decode": kind, "tau": trace["tau"]},
                       **({} if args.tag_repeat is None else {"repeat": args.tag_repeat}))
            rows.append(row)
            print(json.dumps(rows[-1]), flush=True)
        if cuda:
            torch.cuda.empty_cache()
    return rows


def _profiled_pass(decodes, clock, path: Path) -> None:
    """One more plain pass of ``decodes`` under cProfile, its heaviest functions by own and by cumulative
    time written to ``path``: where the host's time goes in a mode's decodes (CUDA waits included, in the
    calls that wait)."""
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    try:
        _plain_pass(decodes, clock)
    finally:
        profile.disable()
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(60)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.getvalue())


def _recorded_calls(steps) -> list[tuple[int, int, list[int]]]:
    """(rows, accepted, parents) of every recorded step, as ``GenerateResult.steps`` holds them."""
    from specfold_compile.decoding.device_step import STATUS_FIELDS

    accepted, rows, parents = STATUS_FIELDS.index("accepted"), STATUS_FIELDS.index("rows"), len(STATUS_FIELDS)
    return [(int(s.status[rows]), int(s.status[accepted]), s.status[parents:parents + int(s.status[rows])].tolist())
            for s in steps]


def parse_override(ap, text: str) -> dict[str, int]:
    """``--override FIELD=INT,...`` as a dict (the parser's one-line error otherwise)."""
    try:
        return {k: int(v) for k, v in (kv.split("=") for kv in text.split(",") if kv)}
    except ValueError:
        ap.error(f"--override: expected FIELD=INT,..., got {text!r}")


def run_command(ap, args, out: str, record, replay, suite: str, setup) -> int:
    """``record``: ``torch.save(record(args), out)``. ``replay``: the ``--trace`` loaded, its decode settings
    in ``args``, the rows of ``replay(args, trace, name)`` for every ``--models`` name written to ``out``
    (``suite``, the seconds taken and ``setup(trace)`` beside them). Returns the exit status."""
    t0 = time.perf_counter()
    with torch.inference_mode():
        if args.command == "record":
            torch.save(record(args), out)
            print(f"wrote {out}")
            return 0
        if not args.trace:
            ap.error("replay: --trace FILE expected (made by the record command)")
        trace = torch.load(args.trace, weights_only=False)
        args.max_new_tokens, args.draft_budget = trace["max_new_tokens"], trace["draft_budget"]
        try:
            rows = [row for name in args.models.split(",") for row in replay(args, trace, name)]
        finally:
            gc.unfreeze()
    write_json(Path(out), rows, {"suite": suite, "seconds": time.perf_counter() - t0, "setup": setup(trace)})
    print(f"wrote {out}")
    return 0


def main(argv=None) -> int:
    from specfold_compile.tasks import TASKS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("record", "replay"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--trace", default=None, help="replay: the record to replay")
    ap.add_argument("--limit", type=int, default=4, help="record: prompts per task")
    ap.add_argument("--split", default="test", choices=("test", "train"), help="record: the task suite's split")
    ap.add_argument("--heads-from", default=None, metavar="TRACE",
                    help="replay: the record whose fold masks give specfold_heads its per-layer heads")
    ap.add_argument("--heads-quantile", type=float, default=0.9,
                    help="replay: the quantile of each gate's computed share that its head holds")
    ap.add_argument("--dense-fraction", type=float, default=None, metavar="F",
                    help="replay: specfold_heads with one head for every layer, F of the rows "
                         "(instead of --heads-from)")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--tau", type=float, default=0.1, help="record: SpecFold's fold threshold")
    ap.add_argument("--grid", action="store_true",
                    help="record: prompts left-padded (pad token) to whole blocks, replayable by either family")
    ap.add_argument("--fuse-boundaries", nargs="?", const=True, default=False, choices=("writes",),
                    help="record: generate(fuse_boundaries=True)'s loop, or with 'writes' "
                         "generate(fuse_boundaries='writes')'s (replay: read from the record)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--draft-budget", type=int, default=16)
    ap.add_argument("--models", default="fast-dllm-v2-1.5b", help="replay: comma-separated presets")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--override", default="", metavar="FIELD=INT,...",
                    help="replay: integer config fields replacing the presets' (e.g. a tiny preset at the record's "
                         "block size: block_size=32,sub_block_size=8,vocab_size=1040)")
    ap.add_argument("--repeats", type=int, default=1, help="replay: timed passes, each prompt's median kept")
    ap.add_argument("--tag-repeat", type=int, default=None, metavar="K",
                    help="replay: tag every row with repeat=K, one of several runs of the same points (bench.plot "
                         "keeps such runs apart when merging, and the ratio columns compare within a run)")
    ap.add_argument("--eager-graphs", action="store_true", help="replay on the CPU: VerifyGraphs(replay='eager')")
    ap.add_argument("--compile-writes", action="store_true",
                    help="the prefill and block writes through torch.compile (generate's compile_writes)")
    ap.add_argument("--all-logits", action="store_true",
                    help="replay: every position's logits in each step (generate(all_logits=True)), where by default "
                         "the device loop asks for the main state's masked positions' and position 0's")
    ap.add_argument("--freeze-gc", action="store_true",
                    help="replay: gc.freeze() after each mode's warm-up (the timed decodes' collections skip it)")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="replay: one more plain pass a mode under cProfile, written to DIR/prof_MODEL_MODE.txt")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    args.tasks, args.modes = tuple(args.tasks.split(",")), tuple(args.modes.split(","))
    args.override = parse_override(ap, args.override)
    if sorted(set(args.modes) - set(MODES) - set(ON_REQUEST)):
        ap.error(f"--modes: expected names among {list(MODES + ON_REQUEST)}, got {args.modes}")
    if args.heads_from is not None and args.dense_fraction is not None:
        ap.error("--dense-fraction: expected instead of --heads-from, not with it")
    if ("specfold_heads" in args.modes) != (args.heads_from is not None or args.dense_fraction is not None):
        ap.error("--heads-from: expected with the mode specfold_heads (and only with it), or --dense-fraction")
    if args.dense_fraction is not None and not 0 < args.dense_fraction <= 1:
        ap.error(f"--dense-fraction: expected a fraction in (0, 1], got {args.dense_fraction}")
    args.heads = args.dense_fraction  # one fraction, or (--heads-from) a profile: Tuning's dense_fraction
    if args.heads_from is not None:
        try:
            args.heads = head_profile(torch.load(args.heads_from, weights_only=False), args.heads_quantile)
        except (OSError, ValueError) as e:
            ap.error(f"--heads-from {args.heads_from}: {e}")
    if args.tag_repeat is not None and args.tag_repeat < 1:
        ap.error(f"--tag-repeat: expected a run number >= 1, got {args.tag_repeat}")
    if args.device == "cpu":
        torch.set_num_threads(1)
    default = "trace.pt" if args.command == "record" else "end_to_end_trace.json"
    out = args.out or str(Path(os.environ.get("OUT") or ".") / default)
    check_output(ap, out)
    return run_command(ap, args, out, record, replay, "end_to_end", lambda trace: {
        "trace": args.trace, "record_model": trace["model"], "tau": trace["tau"], "prompts": len(trace["prompts"]),
        "repeats": args.repeats, "max_new_tokens": args.max_new_tokens, "draft_budget": args.draft_budget,
        "fuse_boundaries": trace.get("fuse_boundaries", False), "device": args.device,
        "compile_writes": args.compile_writes, "freeze_gc": args.freeze_gc, "all_logits": args.all_logits,
        "heads_from": args.heads_from,
        "dense_fraction": None if args.heads is None else _heads_fields(args)["dense_fraction"]})


if __name__ == "__main__":
    raise SystemExit(main())
