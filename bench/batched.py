"""Batched serving at real shapes, trace-driven: throughput and per-request latency of the serving
``Engine`` at several concurrencies, each serving mode, on random-weight models of the 1.5B / 7B shapes.

Random weights decode nothing meaningful, so every request's decisions come from a record. ``record``
serves task-suite prompts with the shipped model through the ``Engine`` on the CPU, once per serving mode
(``serving.SERVING_MODES``: vanilla, Spiffy and SpecFold at ``--tau``), and keeps per request every
block's opening state (its seed included), every verification call's rows and parents, the drafts it
accepted, the state it committed to and (SpecFold) its fold masks, forced in the replay. ``replay`` serves those requests with the real
``Engine`` loop on a random model of a real shape: each request's decode state is the engine's own
(``Engine.new_decode``), subclassed to force the record: the engine builds each call's drafts and runs
the commit rule and acceptance walk on the replay model's logits as it always does (the host work of a
real request), then the recorded rows go into the batched forward and the recorded state is committed.
So every request makes exactly its recorded calls (rows, parents, accepted drafts, block writes, tokens)
at the real shape's cost, next to whichever requests share its engine steps. ``trace_reproduced`` says
that every request's tokens, forwards, blocks and calls equal its record's, and the engine's forwards
covered exactly the recorded rows. ``MODE_compiled`` replays MODE's record with the decoder layers'
position-wise pieces compiled (``replay_modes``). ``--draft-budget`` bounds a record's drafts a call (a
row's ``draft_budget``: the record's; fewer drafts, fewer rows a forward and fewer drafts accepted).
``--max-verify-rows R`` records with ``Engine(max_verify_rows=R)``: the drafts a call depend on how many
requests share the step, so such a record is made for one concurrency, ``--record-slots C`` and
``--record-requests N`` (the prompts in turn) as the replay at ``--concurrency C`` serves them
(``max(--requests, --per-slot * C)``); that replay then takes each step's record as it was made (a row's
``max_verify_rows``), and a replay at another concurrency or request count is refused.
``--loop host,device`` replays with each ``Engine(loop=...)``: under ``device`` every step's commit rule,
acceptance walk and next drafts run as batched tensor ops on the model's device on the replay model's
confidences, then the recorded next calls are copied into the engine's slot buffers (one host-to-device
copy a step, ``batched_forcing.force_slots``) and the recorded states committed.

Arrivals. ``--arrival closed`` (default): ``C`` clients, each sending its next request as soon as its
last one finished; served as ``max(--requests, --per-slot * C)`` requests (default: 16, and 4 a slot)
queued at t = 0 on an engine of ``C`` slots, a request's latency measured from its admission (when its
client sent it) to its last block.
``--arrival poisson --rate R``: requests arrive at fixed pseudo-random times (exponential gaps of mean
``1/R`` s, seed 0) into an engine of ``C`` slots; latency from arrival (queueing included). Request ``j``
replays recorded request ``j mod n``. Throughput: all requests' generated tokens over the wall time from
the first arrival to the last request's end, ``torch.cuda.synchronize()`` at both ends only (each engine
step reads its confidences back anyway). ``peak_bytes``: ``torch.cuda.max_memory_allocated()`` over a
timed run (weights, KV pool, activations). Each (mode, concurrency) point is timed ``--repeats`` times,
the run of median wall time kept, after untimed passes per mode at the largest concurrency (as many
requests as slots) and at concurrency 1 (two requests; compiles happen there).

``--attention per_request,ragged`` replays every mode on each of the engine's attention paths (a row's
``attention``; the default, ``auto``, is the engine's own choice on ``--device``). ``--pool-tokens T`` sizes every pool slot for ``T`` positions (``pool_bytes`` reports
it). ``--freeze-gc`` moves everything alive after a mode's warm-up out of the garbage collector's sight
(``gc.freeze()``, as a warm serving process may), so the timed runs' collections (a row's ``gc_s``) walk
only what they allocate. ``--profile DIR`` serves each mode's largest concurrency once more (as many requests as slots)
under ``torch.profiler`` and writes its operator table to DIR::

    python -m bench.batched record --out TRACE.pt [--limit 22] [--tasks math,code,instruct] [--no-eos-stop]
        [--draft-budget D] [--max-verify-rows R --record-slots C --record-requests N]
    python -m bench.batched replay --trace TRACE.pt --device cuda --models fast-dllm-v2-1.5b \\
        [--concurrency 1,4,16,64] [--requests 16] [--per-slot 4] [--attention per_request,ragged]
        [--pool-tokens 4096] [--profile DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import time
from collections import deque
from pathlib import Path

import torch

from bench.batched_args import add_engine_arguments
from bench.batched_capacity import fold_capacity, parse_capacity_arguments
from bench.batched_clock import GcClock, PassClock, arrival_times, percentile
from bench.batched_forcing import _Forcing, _Recording, _as, force_slots, forced_tensors
from bench.common import check_output, freeze_collector, write_profile
from bench.trace_driven import parse_override, run_command, token_map

CONCURRENCY = (1, 4, 16, 64)
COMPILED = "_compiled"  # a mode's suffix: the engine's compile_layers (its position-wise layer pieces compiled)


def serving_modes() -> tuple[str, ...]:
    """The modes the engine serves (``serving.SERVING_MODES``): each gets its rows."""
    from specfold_compile.serving import SERVING_MODES

    return tuple(SERVING_MODES)


def replay_modes() -> tuple[str, ...]:
    """The served modes and each one ``_compiled``: the engine's mode with
    ``Engine(compile_layers=--compile-backend)``, every decoder layer's position-wise pieces (norms,
    q/k/v and output projections, RoPE, MLP) compiled with dynamic shapes (``serving.compiled``)."""
    served = serving_modes()
    return served + tuple(m + COMPILED for m in served)


def record(args) -> dict:
    """The shipped model (or ``--model``) serving the task-suite prompts through the Engine, per mode."""
    from specfold_compile.loading import encode, load_model, resolve_draft_graph
    from specfold_compile.serving import Engine, RequestParams
    from specfold_compile.serving.batch import _positions_needed
    from specfold_compile.tasks import sample

    model = load_model(args.model, device="cpu")
    cfg = model.config
    path = resolve_draft_graph(args.model, None)  # kept in the record, which may be replayed elsewhere
    graph = None if path is None else json.loads(Path(path).read_text())
    problems = {task: sample(task, "test", args.limit, 0) for task in args.tasks}
    prompts, tasks = [], []
    for i in range(args.limit):  # the tasks in turn, so that any run of requests mixes them
        for task in args.tasks:
            prompts.append(encode(model, problems[task][i].prompt))
            tasks.append(task)
    n = args.record_requests or len(prompts)
    prompts, tasks = [prompts[j % len(prompts)] for j in range(n)], [tasks[j % len(tasks)] for j in range(n)]
    params = RequestParams(max_new_tokens=args.max_new_tokens, draft_budget=args.draft_budget,
                           stop_at_eos=not args.no_eos_stop)
    requests = [{"task": t, "prompt": p} for t, p in zip(tasks, prompts)]
    modes = args.modes or serving_modes()
    for mode in modes:
        engine = Engine(model, max_requests=min(args.record_slots, len(prompts)), mode=mode, draft_graph=graph,
                        tau=args.tau if mode == "specfold" else None, max_verify_rows=args.max_verify_rows,
                        max_tokens_per_request=_positions_needed(model, prompts, args.max_new_tokens))
        decodes = []
        for prompt in prompts:
            decode = _as(engine.new_decode(prompt, params), _Recording)
            decode.record = {"starts": [], "calls": []}
            decodes.append((engine.submit(decode), decode))
        for _ in engine.run():
            pass
        for req, (rid, decode) in zip(requests, decodes):
            for call, masks in zip(decode.record["calls"], engine.output(rid).fold_masks):
                call["fold_masks"] = masks  # SpecFold: the masks its gates chose, forced in the replay
            res = decode.result()
            req[mode] = {**decode.record, "tokens": res.tokens, "nfe": res.nfe, "blocks": res.blocks}
        calls = sum(len(r[mode]["calls"]) for r in requests)
        print(f"recorded {mode}: {len(requests)} requests, {calls} calls, {engine.stats.verify_calls} engine "
              "forwards", flush=True)
    return {"model": args.model or "specfold-tiny", "modes": list(modes), "draft_graph": graph,
            "max_new_tokens": args.max_new_tokens, "draft_budget": args.draft_budget,
            "max_verify_rows": args.max_verify_rows, "record_slots": args.record_slots,
            "stop_at_eos": not args.no_eos_stop, "mask_token_id": cfg.mask_token_id, "eos_token_id": cfg.eos_token_id,
            "vocab_size": cfg.vocab_size, "block_size": cfg.block_size, "family": cfg.family, "requests": requests}


# --- replay --------------------------------------------------------------------------------------
def serve(model, mode: str, concurrency: int, requests: list[dict], args, cuda: bool,
          attention: str = "auto", graphs=None, compile_layers: bool | str = False, loop: str = "host",
          rows_ahead: bool = True) -> dict:
    """One timed run: ``requests`` (recorded request, forced tensors, mapped prompt) served by an engine of
    ``concurrency`` slots as they arrive; the row's numbers and whether every request followed its record.
    ``graphs``: a ``serving.graphs.BatchGraphs`` the engine replays its passes from (None: launched);
    ``compile_layers``: the engine's (its graphs' with ``graphs``); ``loop``: the engine's (``force_slots``
    forces the device loop's calls); ``rows_ahead``: the engine's switch of that name."""
    from specfold_compile.serving import Engine, RequestParams

    params = RequestParams(max_new_tokens=args.max_new_tokens, draft_budget=args.draft_budget,
                           stop_at_eos=args.stop_at_eos)
    arrivals = arrival_times(len(requests), args)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    engine = Engine(model, max_requests=concurrency, max_tokens_per_request=args.capacity, mode=mode,
                    draft_graph=args.graph, tau=args.tau if mode == "specfold" else None, attention=attention,
                    cuda_graphs=False if graphs is None else graphs, compile_layers=compile_layers,
                    max_verify_rows=None if mode == "vanilla" else args.max_verify_rows, loop=loop,
                    compile_step=False if args.eager_step else None)
    engine.rows_ahead = rows_ahead
    # the device loop reads a replayed forward's results only after its bookkeeping: no split of its time
    clock = None if graphs is None or loop == "device" else PassClock(engine)
    pending, decodes, done, tally = deque(range(len(requests))), {}, {}, {}
    if loop == "device":
        force_slots(engine, tally)
    collector, t0 = GcClock(), time.perf_counter()
    while pending or engine.has_work:
        now = time.perf_counter() - t0
        while pending and arrivals[pending[0]] <= now:
            j = pending.popleft()
            decode = _as(engine.new_decode(requests[j]["prompt"], params), _Forcing)
            decode.forced, decode.tally = requests[j]["forced"], (tally, engine.stats)
            decodes[engine.submit(decode)] = (j, decode)
        if not engine.has_work:
            time.sleep(max(0.0, arrivals[pending[0]] - now))
            continue
        for block in engine.step():
            if block.finished:
                done[block.request_id] = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    parts = {**collector.read(), **({} if clock is None else clock.parts(wall))}
    if clock is not None:
        clock.close()
    latencies, tokens, reproduced, rows = [], 0, len(done) == len(requests), 0
    for rid, (j, decode) in decodes.items():
        out = engine.pop(rid)
        rec, table = requests[j]["record"], args.table
        start = decode.t0 - t0 if args.arrival == "closed" else arrivals[j]
        latencies.append(1e3 * (done[rid] - start))
        if out.status != "finished":
            reproduced = False
            continue
        res = out.result
        tokens += len(res.tokens)
        calls = [(int(s.branches), int(s.accepted), list(s.parents)) for s in res.steps]
        reproduced &= (res.tokens == table[torch.tensor(rec["tokens"], dtype=torch.long)].tolist()
                       and (res.nfe, res.blocks) == (rec["nfe"], rec["blocks"])
                       and calls == [(int(c["rows"].shape[0]), c["accepted"], c["parents"]) for c in rec["calls"]])
        rows += sum(int(c["rows"].shape[0]) for c in rec["calls"])
    reproduced &= engine.stats.verify_rows == rows
    st = engine.stats
    return {"tokens_per_s": tokens / wall, "p50_latency_ms": percentile(latencies, 50),
            "p99_latency_ms": percentile(latencies, 99), "wall_s": wall, "requests": len(requests),
            "tokens": tokens, "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "pool_bytes": engine.pool.nbytes(), "verify_calls": st.verify_calls,
            "rows_per_forward": st.verify_rows / max(1, st.verify_calls),
            "requests_per_forward": st.verify_requests / max(1, st.verify_calls),
            "max_rows_per_forward": max((t[0] for t in tally.values()), default=0),
            "max_logit_positions": max((t[1] for t in tally.values()), default=0), "trace_reproduced": reproduced,
            "overflows": st.overflows, **parts}


def _graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process (a timed run that adds some paid for compiling)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def replay(args, trace: dict, name: str) -> list[dict]:
    """Every mode and concurrency on a random model of preset ``name`` (bf16 on CUDA, float32 on the CPU)."""
    from specfold_compile.models import build
    from specfold_compile.serving.batch import _positions_needed

    cuda = args.device == "cuda"
    if trace.get("max_verify_rows") is not None:  # its drafts a call follow the steps it was made in
        made = (trace["record_slots"], len(trace["requests"]))
        served = [(c, max(args.requests, args.per_slot * c)) for c in args.concurrency]
        if any(point != made for point in served):
            raise SystemExit(f"--concurrency: a record made with --max-verify-rows replays as it was made, on "
                             f"{made[0]} slots with {made[1]} requests; got (slots, requests) {served}")
    model = build(name, device=args.device, dtype=torch.bfloat16 if cuda else torch.float32, seed=0, **args.override)
    cfg = model.config
    if cfg.block_size != trace["block_size"]:
        raise SystemExit(f"--models {name}: block size {cfg.block_size}, the record's is {trace['block_size']}")
    if cfg.family != trace["family"]:
        raise SystemExit(f"--models {name}: a {cfg.family} model lays prompts out unlike the record's "
                         f"{trace['family']} model")
    args.table = table = token_map(trace, cfg)
    args.graph, args.stop_at_eos = trace["draft_graph"], trace["stop_at_eos"]
    args.max_verify_rows = trace.get("max_verify_rows")  # the engine's that made the record
    prompts = [table[r["prompt"]] for r in trace["requests"]]  # the engine moves its prefill ids
    args.capacity = max(_positions_needed(model, prompts, args.max_new_tokens), args.pool_tokens or 0)
    rows = []
    recorded_modes = [m for m in trace["modes"] if m in serving_modes()]
    for mode in args.modes or recorded_modes + [m + COMPILED for m in recorded_modes if m + COMPILED in replay_modes()]:
        kind = mode.removesuffix(COMPILED)  # the engine's mode, and the record's
        if kind not in trace["modes"]:
            raise SystemExit(f"--modes {mode}: the record has {trace['modes']} (record again with the mode served)")
        recorded = [{"record": r[kind], "prompt": p,
                     "forced": forced_tensors(r[kind], table, trace["mask_token_id"], len(model.layers))}
                    for r, p in zip(trace["requests"], prompts)]

        def workload(n: int) -> list[dict]:
            return [recorded[j % len(recorded)] for j in range(n)]
        for attention in args.attention:
            for graphed in args.cuda_graphs:
                if graphed and attention != "ragged":
                    continue  # the graphs replay the ragged kernel
                for capacity in args.fold_capacity if graphed and kind == "specfold" else (None,):
                    for loop in args.loop:
                        rows += _replay_mode(model, name, mode, kind, attention, workload, args, cuda, trace["model"],
                                             graphed, capacity and fold_capacity(capacity, recorded, len(model.layers)),
                                             loop)
        if cuda:
            torch.cuda.empty_cache()
    return rows


def _replay_mode(model, name: str, mode: str, kind: str, attention: str, workload, args, cuda: bool,
                 recorded_by: str, graphed: bool = False, capacity: tuple | None = None,
                 loop: str = "host") -> list[dict]:
    """Every concurrency of one mode (engine mode ``kind``; the layers compiled if ``mode`` says so) on one
    attention path, launched or (``graphed``) replayed from one ``BatchGraphs`` shared by its engines,
    after its own warm-up (with graphs: a pass at every concurrency, capturing its buckets). ``capacity``:
    SpecFold's graphs' ``(label, fold_capacity)``; ``loop``: the engine's step bookkeeping."""
    rows = []
    graphs = None
    compile_layers = args.compile_backend if mode != kind else False  # the Engine's (and its graphs')
    if graphed:
        from specfold_compile.serving.graphs import BatchGraphs

        graphs = BatchGraphs(model, max(args.concurrency), args.capacity, "cuda" if cuda else "eager",
                             **({} if capacity is None else {"fold_capacity": capacity[1]}),
                             min_packed=args.min_packed, capacity_spread=args.capacity_spread,
                             compile_layers=compile_layers, gate_kernel=None if args.gate_kernel == "auto" else False,
                             packed_attention=args.packed_attention == "on")
    t0 = time.perf_counter()
    # warm-up (compiles; a single request's row counts of 1 too, which dynamic shapes specialize)
    warm = args.concurrency if graphed else {max(args.concurrency), 1}
    for c in sorted(warm, reverse=True):
        try:
            serve(model, kind, c, workload(max(c, 2) if not graphed else max(args.requests, args.per_slot * c)),
                  args, cuda, attention, graphs, compile_layers, loop)
        except torch.OutOfMemoryError:  # the timed point will say so; the stopped engine's slots freed
            torch.cuda.empty_cache()
            if graphs is not None:
                graphs.pool.free_all()
    warm_s = time.perf_counter() - t0
    if args.freeze_gc:
        freeze_collector()
    # rows built ahead exist in the host loop with graphs only (Engine._rows_ahead): one value elsewhere
    aheads = args.rows_ahead if graphed and loop == "host" else (True,)
    for c, ahead in itertools.product(args.concurrency, aheads):
        n, compiled = max(args.requests, args.per_slot * c), _graphs_compiled()
        captured = graphs.captures if graphed else 0
        try:
            runs = sorted((serve(model, kind, c, workload(n), args, cuda, attention, graphs, compile_layers, loop, ahead)
                           for _ in range(args.repeats)), key=lambda r: r["wall_s"])
        except torch.OutOfMemoryError as exc:  # this point has no row; the file's setup names it
            args.out_of_memory.append({"model": name, "mode": mode, "attention": attention, "concurrency": c,
                                       "loop": loop})
            if graphs is not None:
                graphs.pool.free_all()
            print(f"{name} {mode} ({attention}) at concurrency {c}: out of memory "
                  f"({str(exc).splitlines()[0]})", flush=True)
            torch.cuda.empty_cache()
            continue
        row = {"model": name, "concurrency": c, "mode": mode, "attention": attention, **runs[len(runs) // 2],
               "trace_driven": True, "trace_reproduced": all(r["trace_reproduced"] for r in runs),
               "warmup_s": warm_s, "compiles_while_timed": _graphs_compiled() - compiled,
               "cuda_graphs": graphed, "captures_while_timed": (graphs.captures - captured) if graphed else 0,
               "loop": loop, "compile_step": loop == "device" and cuda and not args.eager_step,
               **({} if len(aheads) == 1 else {"rows_ahead": ahead}),
               "arrival": args.arrival if args.arrival == "closed" else f"poisson {args.rate:g}/s",
               "record": {"model": recorded_by, "mode": kind},
               "draft_budget": 0 if kind == "vanilla" else args.draft_budget,  # the record's (run_command)
               "max_verify_rows": None if kind == "vanilla" else args.max_verify_rows, "freeze_gc": args.freeze_gc}
        if capacity is not None:
            row.update(fold_capacity=capacity[0], fold_shares=capacity[1], min_packed=args.min_packed,
                       capacity_spread=args.capacity_spread, gate_kernel=graphs.gate_kernel,
                       packed_attention=graphs.packed_attention)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.freeze_gc:
        gc.unfreeze()
    if args.profile:
        c = max(args.concurrency)
        write_profile(lambda: serve(model, kind, c, workload(c), args, cuda, attention, graphs, compile_layers, loop),
                      Path(args.profile) / f"{name}_{mode}_{attention}{'_device' if loop == 'device' else ''}_c{c}.txt",
                      cuda)
    return rows


def main(argv=None) -> int:
    from specfold_compile.tasks import TASKS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("record", "replay"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"),
                    help="replay: where the model runs (record runs on the CPU)")
    ap.add_argument("--trace", default=None, help="replay: the record to replay")
    ap.add_argument("--model", default=None, help="record: a checkpoint or preset (default: the shipped model)")
    ap.add_argument("--limit", type=int, default=22, help="record: test-split prompts per task")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--record-slots", type=int, default=8, help="record: the engine's slots")
    ap.add_argument("--record-requests", type=int, default=None,
                    help="record: requests served, the prompts in turn (default: each prompt once)")
    ap.add_argument("--max-verify-rows", type=int, default=None,
                    help="record: Engine(max_verify_rows=R), drafts cut to R rows a forward (a row's max_verify_rows)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--tau", type=float, default=0.1, help="SpecFold's fold threshold (mode specfold)")
    ap.add_argument("--draft-budget", type=int, default=16, help="record: Spiffy's drafts a call (a replay takes "
                    "the record's; a row's draft_budget)")
    ap.add_argument("--no-eos-stop", action="store_true",
                    help="record: every request decodes all --max-new-tokens (the shipped model's answers are short)")
    ap.add_argument("--modes", default=None,
                    help="comma-separated (default: record every serving mode; replay every recorded one and "
                         "each one _compiled)")
    ap.add_argument("--models", default="fast-dllm-v2-1.5b", help="replay: comma-separated presets")
    ap.add_argument("--override", default="", metavar="FIELD=INT,...",
                    help="replay: integer config fields replacing the presets' (e.g. a tiny preset at the record's "
                         "block size: block_size=32,sub_block_size=8,vocab_size=1040)")
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)), help="replay: engine slots, comma-separated")
    ap.add_argument("--requests", type=int, default=16, help="replay: requests a run serves, at least")
    ap.add_argument("--per-slot", type=int, default=4,
                    help="replay: and at least this many times the concurrency (each slot serves several in turn)")
    ap.add_argument("--arrival", default="closed", choices=("closed", "poisson"))
    ap.add_argument("--rate", type=float, default=None, help="--arrival poisson: requests per second")
    add_engine_arguments(ap)
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="replay: each mode's largest concurrency served once more under torch.profiler, its table "
                         "written to DIR")
    ap.add_argument("--freeze-gc", action="store_true",
                    help="replay: gc.freeze() after each mode's warm-up, undone after its timed runs (a row's freeze_gc)")
    ap.add_argument("--repeats", type=int, default=1, help="replay: timed runs a point, the median kept")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    modes = serving_modes() if args.command == "record" else replay_modes()
    args.tasks = tuple(args.tasks.split(","))
    if args.modes is not None:
        args.modes = tuple(args.modes.split(","))
        if sorted(set(args.modes) - set(modes)):
            ap.error(f"--modes: expected names among {list(modes)} (serving.SERVING_MODES, and *_compiled in replay), "
                     f"got {list(args.modes)}")
    args.override = parse_override(ap, args.override)
    from specfold_compile.serving.forward import engine_attention

    try:
        args.attention = tuple(engine_attention(a, torch.device(args.device)) for a in args.attention.split(","))
    except ValueError as exc:
        ap.error(f"--{exc}")
    try:
        args.concurrency = tuple(int(c) for c in args.concurrency.split(","))
    except ValueError:
        ap.error(f"--concurrency: expected INT,..., got {args.concurrency!r}")
    if min(args.concurrency) < 1 or min(args.requests, args.per_slot, args.repeats) < 1:
        ap.error("--concurrency, --requests, --per-slot, --repeats: expected ints >= 1")
    if args.arrival == "poisson" and not (args.rate and args.rate > 0):
        ap.error("--rate: --arrival poisson expects a rate > 0 (requests per second)")
    if args.device == "cpu" or args.command == "record":
        torch.set_num_threads(1)
    out = args.out or str(Path(os.environ.get("OUT") or ".") / ("batched_trace.pt" if args.command == "record"
                                                                   else "batched.json"))
    check_output(ap, out)
    args.out_of_memory = []
    args.cuda_graphs = tuple(v == "on" for v in args.cuda_graphs.split(","))
    args.loop = tuple(args.loop.split(","))
    args.rows_ahead = tuple(v == "on" for v in args.rows_ahead.split(","))
    parse_capacity_arguments(ap, args)
    return run_command(ap, args, out, record, replay, "batched", lambda trace: {
        "trace": args.trace, "record_model": trace["model"], "recorded_requests": len(trace["requests"]),
        "requests": args.requests, "per_slot": args.per_slot, "arrival": args.arrival, "rate": args.rate,
        "repeats": args.repeats, "max_new_tokens": args.max_new_tokens, "draft_budget": args.draft_budget,
        "stop_at_eos": trace["stop_at_eos"], "device": args.device, "out_of_memory": args.out_of_memory})


if __name__ == "__main__":
    raise SystemExit(main())
