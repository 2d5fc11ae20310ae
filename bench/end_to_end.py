"""End-to-end decoding speed of the shipped model: the Python decode loop against the device loop.

Decodes task-suite prompts (``specfold_compile.tasks``, test split) with ``generate`` in each mode:

    vanilla          mode="vanilla", loop="host"
    vanilla_device   mode="vanilla", loop="device"
    spiffy           mode="spiffy",  loop="host"   (the shipped draft graph, --draft-budget)
    spiffy_device    mode="spiffy",  loop="device"
    spiffy_compiled  mode="spiffy",  loop="host",   the model compiled with Inductor (dense)
    spiffy_compiled_device                            the same, device loop
    specfold         mode="spiffy",  loop="host",   the model compiled with the SpecFold backend (--tau)
    specfold_device  mode="spiffy",  loop="device", the same compiled model
    NAME_readK       a device-loop mode launching K steps before each read (``steps_per_read=K``; K in
                     2, 4, 8; asked for by name only)
    NAME_fused       a mode with its block boundaries fused (``fuse_boundaries=True``; by name only)
    NAME_launched_prefill  a mode whose prefill is launched and copied into the static cache
                     (``VerifyGraphs(capture_prefill=False)``; by name only)

On CUDA every mode runs with CUDA graphs (``cuda_graphs``: one ``VerifyGraphs`` per mode, kept across
prompts, so captures and compiles happen in the warm-up pass, reported apart as ``warmup_s``); on the
CPU the calls are launched. One row per task and mode::

    model, task, mode, tokens_per_s, nfe, step_ms, host_ms, ttft_ms, trace_driven, cuda_graphs, ...

``tokens_per_s``: generated tokens over the wall time of ``generate`` called on every prompt in turn as a
user calls it, nothing timed inside (the lower median of ``--repeats`` passes, modes interleaved pass by
pass). The breakdown comes from other, instrumented passes (each prompt's median over them, modes
interleaved prompt by prompt), whose own rate is ``instrumented_tokens_per_s`` (the per-part syncs and
events slow a decode down). ``nfe``: forwards per prompt. ``step_ms``: wall time per verification step,
the prefill (launched, or replayed into the static cache) and block writes taken out (each timed with
its GPU work).
``host_ms``: the part of a step that is not the step's own device work (CUDA: the forward's graph, and
in the device loop its bookkeeping, timed with CUDA events; CPU: the forward, timed on the host), i.e.
the host's time on the critical path. ``plain_step_ms`` and ``plain_host_ms``: the same two from the
uninstrumented passes (their wall time less the prefills and block writes that the instrumented passes
timed, over the steps; less also the steps' device work), free of what the instrumentation costs the
host. ``outside_steps_ms`` (device loop): a decode's wall time outside
its prefill, block writes and steps (each step's launch, wait and read), per decode: the setup, the
seeds, the buffers' loads and the blocks' reads, which ``host_ms`` spreads over the steps.
``prefill_ms`` (CUDA): the prompt's prefill per decode, with its GPU work. ``gc_ms`` and
``gc_collections``: the garbage collector's pauses in a decode (a part of the host's time that is not
the loop's own work; ``--freeze-gc`` freezes what is alive after the warm-up, as a serving process may). ``ttft_ms``: from the call to the first block's tokens. ``prefill``:
``"replayed"`` (CUDA: ``VerifyGraphs.prefill``) or ``"launched"`` (the CPU, or a ``_launched_prefill``
mode). ``trace_driven``: False, every number is measured decoding (no replayed trace).
``tokens_match``: the mode's tokens equal vanilla's, prompt for prompt (lossless); ``same_as_host_twin``:
a device-loop mode's tokens and forwards equal those of the same decoding in the Python loop.

    python -m bench.end_to_end [--device cuda] [--limit 20] [--tasks math,code,instruct] [--modes ...]

Writes ``end_to_end.json`` into ``$OUT`` (or ``--out FILE``), with the GPU, driver, torch and triton
versions.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import statistics
import time
from pathlib import Path

import torch

from bench.batched_clock import GcClock
from bench.common import check_output, freeze_collector, write_json

from bench.end_to_end_modes import (AHEAD, CPU_MODES, FUSED, HOST_TWIN, LAUNCHED_PREFILL, MODES, SPECS,
                                    fuse_boundaries, steps_per_read)


class _Clock:
    """Times the parts of one ``generate``: the prefill and block writes (host intervals ending with their
    device work), the steps' device work (CUDA events, or host intervals of the forward on the CPU) and
    the first block write's start."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.reset()

    def reset(self):
        self.writes_s, self.first_write, self.events, self.forward_s, self.steps_s = 0.0, None, [], 0.0, 0.0

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def write(self, fn, first: bool):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            if first and self.first_write is None:
                self.first_write = t0
            out = fn(*args, **kwargs)
            self.sync()  # the loop reads the seed right after: no wait is added
            self.writes_s += time.perf_counter() - t0
            return out
        return timed

    def device_work(self, fn):
        def timed(*args, **kwargs):
            if not self.cuda:
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                self.forward_s += time.perf_counter() - t0
                return out
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            self.events.append((start, end))
            return out
        return timed

    def device_s(self) -> float:
        self.sync()
        return self.forward_s + sum(s.elapsed_time(e) for s, e in self.events) / 1e3


class _TimedModel:
    """The model as a launched decode loop calls it (CPU): forwards and writes timed."""

    def __init__(self, model, clock: _Clock):
        self.config = model.config
        self._model = model
        self.prefill = clock.write(model.prefill, first=False)
        self.write_block = clock.write(model.write_block, first=True)
        self._forward = clock.device_work(model)

    def __call__(self, *args, **kwargs):
        return self._forward(*args, **kwargs)


@contextlib.contextmanager
def _timed_graphs(graphs, clock: _Clock):
    """CUDA: the step replays of both loops (``VerifyGraphs.__call__``, ``DeviceDecoder._replay`` and a
    fused first step's ``_replay_first``) and the block writes of ``graphs`` timed; restored afterwards."""
    from specfold_compile.decoding.cuda_graphs import VerifyGraphs
    from specfold_compile.decoding.device_loop import DeviceDecoder

    saved = VerifyGraphs.__call__, DeviceDecoder._replay, DeviceDecoder._replay_first
    VerifyGraphs.__call__ = clock.device_work(saved[0])
    DeviceDecoder._replay = clock.device_work(saved[1])
    DeviceDecoder._replay_first = clock.device_work(saved[2])
    graphs.write_block = clock.write(type(graphs).write_block.__get__(graphs), first=True)
    try:
        yield
    finally:
        VerifyGraphs.__call__, DeviceDecoder._replay, DeviceDecoder._replay_first = saved
        del graphs.write_block


@contextlib.contextmanager
def _timed_steps(clock: _Clock):
    """The device loop's steps (``DeviceDecoder.steps`` and ``first_step``: launch, wait, read) timed on
    the host into ``clock.steps_s``; restored afterwards."""
    from specfold_compile.decoding.device_loop import DeviceDecoder

    saved = DeviceDecoder.steps, DeviceDecoder.first_step

    def timed(fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                clock.steps_s += time.perf_counter() - t0
        return run
    DeviceDecoder.steps, DeviceDecoder.first_step = map(timed, saved)
    try:
        yield
    finally:
        DeviceDecoder.steps, DeviceDecoder.first_step = saved


def _timed_run(target, prompt, clock: _Clock, graphs, kwargs, decode=None) -> dict:
    """One timed decode: ``generate``, or ``decode`` (called as ``generate`` is)."""
    from specfold_compile.decoding import generate

    clock.reset()
    model = target if graphs is not None else _TimedModel(target, clock)
    prefill_s = 0.0
    if graphs is not None:  # the prefill (launched by the model, or replayed by graphs) timed on the instances
        def timed(prefill):
            def run(*args, **kw):
                nonlocal prefill_s
                t0 = time.perf_counter()
                out = prefill(*args, **kw)
                clock.sync()
                prefill_s += time.perf_counter() - t0
                return out
            return run
        target.prefill, graphs.prefill = timed(target.prefill), timed(graphs.prefill)
    ctx = _timed_graphs(graphs, clock) if graphs is not None else contextlib.nullcontext()
    collector = GcClock()
    try:
        with ctx, _timed_steps(clock):
            t0 = time.perf_counter()
            res = (decode or generate)(model, prompt, cuda_graphs=graphs if graphs is not None else False, **kwargs)
            clock.sync()
            wall = time.perf_counter() - t0
            device_s = clock.device_s()
    finally:
        gc_run = collector.read()
        if graphs is not None:
            del target.prefill, graphs.prefill
    steps = max(res.num_calls, 1)
    if graphs is None:  # the CPU's prefill went through _TimedModel's write clock
        prefill_s, writes_s = 0.0, clock.writes_s
    else:
        writes_s = clock.writes_s
    step_s = (wall - prefill_s - writes_s) / steps
    first = clock.first_write if clock.first_write is not None else t0 + wall
    return {"tokens": res.tokens, "nfe": res.nfe, "steps": res.num_calls, "wall_s": wall,
            "calls": [(s.branches, s.accepted, list(s.parents)) for s in res.steps],
            "step_ms": 1e3 * step_s, "host_ms": 1e3 * (step_s - device_s / steps), "ttft_ms": 1e3 * (first - t0),
            "outside_steps_ms": 1e3 * (wall - prefill_s - writes_s - clock.steps_s) if clock.steps_s else None,
            "prefill_ms": 1e3 * prefill_s if graphs is not None else None,
            "boundary_ms": 1e3 * (prefill_s + writes_s), "device_ms": 1e3 * device_s,
            "gc_ms": 1e3 * gc_run["gc_s"], "gc_collections": gc_run["gc_collections"]}


def _targets(model, modes, device: str, tau: float) -> dict:
    """The model each mode runs: the eager one, or one compiled model per backend (dense Inductor, or
    SpecFold at ``tau``) shared by both loops."""
    compiled: dict[str, object] = {}
    out = {}
    for name in modes:
        backend = SPECS[name][2]
        if backend is None:
            out[name] = model
            continue
        if backend not in compiled:
            if backend == "inductor":
                compiled[backend] = torch.compile(model, dynamic=True)
            else:
                options = {"tau": tau, **({} if device == "cuda" else {"kernels": "torch"})}
                compiled[backend] = torch.compile(model, backend="specfold", options=options)
        out[name] = compiled[backend]
    return out


def run(args) -> list[dict]:
    from specfold_compile.decoding import VerifyGraphs, generate, load_draft_graph
    from specfold_compile.loading import DEFAULT_MODEL_DIR, encode, load_model
    from specfold_compile.tasks import sample

    cuda = args.device == "cuda"
    model = load_model(None, device=args.device)
    name = Path(getattr(model, "name_or_path", "specfold-tiny")).name
    graph = load_draft_graph(str(DEFAULT_MODEL_DIR / "draft_graph.json"), model.config.block_size)  # read once
    modes = args.modes
    targets = _targets(model, modes, args.device, args.tau)
    graphs = {m: VerifyGraphs(targets[m], capture_prefill=m not in LAUNCHED_PREFILL) if cuda else None
              for m in modes}
    # two modes on one target share its VerifyGraphs (one static cache and compiled graph per model)
    for m in modes:
        for other in modes:
            if other < m and targets[other] is targets[m] and cuda and (m in LAUNCHED_PREFILL) == (
                    other in LAUNCHED_PREFILL):
                graphs[m] = graphs[other]
    clock = _Clock(cuda)
    rows = []
    for task in args.tasks:
        prompts = [encode(model, p.prompt).to(args.device) for p in sample(task, "test", args.limit, 0)]
        kwargs = {m: dict(mode=SPECS[m][0], loop=SPECS[m][1], max_new_tokens=args.max_new_tokens,
                          draft_budget=args.draft_budget, draft_graph=graph, compile_writes=args.compile_writes,
                          **({"steps_per_read": steps_per_read(m)} if m in AHEAD else {}),
                          **({"fuse_boundaries": True} if m in FUSED else {})) for m in modes}
        warm_s = {}
        for m in modes:  # warm-up: compiles, captures and autotuning happen here
            t0 = time.perf_counter()
            for prompt in prompts:
                _timed_run(targets[m], prompt, clock, graphs[m], kwargs[m])
            warm_s[m] = time.perf_counter() - t0
        if args.freeze_gc:
            freeze_collector()
        runs = {m: [[] for _ in prompts] for m in modes}
        for _ in range(args.repeats):  # modes interleaved prompt by prompt: drift hits all alike
            for i, prompt in enumerate(prompts):
                for m in modes:
                    runs[m][i].append(_timed_run(targets[m], prompt, clock, graphs[m], kwargs[m]))
        plain = {m: [] for m in modes}  # uninstrumented passes over the prompts, modes interleaved pass by pass
        for _ in range(args.repeats):
            for m in modes:
                on = graphs[m] if graphs[m] is not None else False
                plain[m].append(_plain_pass([functools.partial(generate, targets[m], p, cuda_graphs=on, **kwargs[m])
                                             for p in prompts], clock))
        for m in modes:
            rows.append(_row(name, task, m, runs, warm_s[m], cuda, plain[m]))
            rows[-1].update(prefill="launched" if m in LAUNCHED_PREFILL or not cuda else "replayed",
                            compile_writes=args.compile_writes, freeze_gc=args.freeze_gc)
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _plain_pass(decodes, clock: _Clock) -> tuple[float, int]:
    """(wall seconds, tokens) of ``decodes`` (calls returning a ``GenerateResult``) run in turn, nothing
    timed inside: a user's calls of ``generate`` (``tokens_per_s``)."""
    clock.sync()
    t0, tokens = time.perf_counter(), 0
    for decode in decodes:
        tokens += len(decode().tokens)
    clock.sync()
    return time.perf_counter() - t0, tokens


def _median_run(reps: list[dict]) -> dict:
    return sorted(reps, key=lambda r: r["wall_s"])[len(reps) // 2]


def _row(name, task, mode, runs, warm_s, cuda, plain) -> dict:
    per_prompt = [_median_run(reps) for reps in runs[mode]]
    tokens = sum(len(r["tokens"]) for r in per_prompt)
    wall = sum(r["wall_s"] for r in per_prompt)
    plain_wall, plain_tokens = sorted(plain)[(len(plain) - 1) // 2]  # the lower median
    steps = sum(r["steps"] for r in per_prompt)
    # the plain passes' steps: their wall time less the prefills and block writes (as the instrumented passes
    # timed them, their device work included), and of that what the steps' device work does not cover
    plain_step_ms = (1e3 * plain_wall - sum(r["boundary_ms"] for r in per_prompt)) / max(steps, 1)
    plain_host_ms = plain_step_ms - sum(r["device_ms"] for r in per_prompt) / max(steps, 1)

    def first(m, key):
        return [reps[0][key] for reps in runs[m]]

    def per_step(key):
        return sum(r[key] * r["steps"] for r in per_prompt) / max(steps, 1)

    def mean_of(key):  # None where a decode has none: the Python loop's outside_steps_ms, the CPU's prefill_ms
        values = [r[key] for r in per_prompt]
        return None if None in values else statistics.mean(values)

    twin = HOST_TWIN.get(mode)
    lossless = "vanilla" if "vanilla" in runs else twin if twin in runs else None  # the tokens to equal, if asked for
    return {"model": name, "task": task, "mode": mode, "tokens_per_s": plain_tokens / plain_wall,
            "instrumented_tokens_per_s": tokens / wall,
            "nfe": statistics.mean(r["nfe"] for r in per_prompt), "step_ms": per_step("step_ms"),
            "host_ms": per_step("host_ms"), "plain_step_ms": plain_step_ms, "plain_host_ms": plain_host_ms,
            "ttft_ms": statistics.mean(r["ttft_ms"] for r in per_prompt),
            "outside_steps_ms": mean_of("outside_steps_ms"), "prefill_ms": mean_of("prefill_ms"),
            "gc_ms": mean_of("gc_ms"), "gc_collections": mean_of("gc_collections"),
            "trace_driven": False, "cuda_graphs": cuda, "loop": SPECS[mode][1], "steps_per_read": steps_per_read(mode),
            "fuse_boundaries": fuse_boundaries(mode),
            "prompts": len(per_prompt),
            "tokens": tokens, "steps": steps, "warmup_s": warm_s,
            "tokens_match": None if lossless is None else first(mode, "tokens") == first(lossless, "tokens"),
            "host_twin": twin if twin in runs else None,
            "same_as_host_twin": (first(mode, "tokens") == first(twin, "tokens")
                                  and first(mode, "nfe") == first(twin, "nfe")) if twin in runs else None}


def main(argv=None) -> int:
    from specfold_compile.tasks import TASKS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--limit", type=int, default=20, help="test-split prompts per task")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--modes", default=None, help=f"comma-separated among {', '.join(MODES)} (default: all on "
                                                  f"CUDA, {', '.join(CPU_MODES)} on the CPU), a device-loop "
                                                  "mode's NAME_readK (K in 2, 4, 8: K steps launched a read) "
                                                  "and any mode's NAME_fused (fuse_boundaries=True) or "
                                                  "NAME_launched_prefill")
    ap.add_argument("--repeats", type=int, default=None, help="timed passes, each prompt's median kept (default: 3 "
                                                              "on CUDA, 1 on the CPU)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--draft-budget", type=int, default=16)
    ap.add_argument("--tau", type=float, default=0.1, help="SpecFold's fold threshold (0 folds nothing)")
    ap.add_argument("--compile-writes", action="store_true",
                    help="every mode's prefill and block writes through torch.compile (generate's compile_writes)")
    ap.add_argument("--freeze-gc", action="store_true",
                    help="gc.freeze() after the warm-up: the timed decodes' collections skip what is alive then")
    ap.add_argument("--out", default=None, help="the JSON file (default: $OUT/end_to_end.json, else ./end_to_end.json)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (--device cpu runs the same on the CPU)")
    args.modes = tuple(args.modes.split(",")) if args.modes else (tuple(MODES) if args.device == "cuda" else CPU_MODES)
    unknown = sorted(set(args.modes) - set(SPECS))
    if unknown:
        ap.error(f"--modes: expected names among {list(MODES)}, a device mode's NAME_readK or a mode's NAME_fused or "
                 f"NAME_launched_prefill, got {unknown}")
    args.tasks = tuple(args.tasks.split(","))
    if args.repeats is None:
        args.repeats = 3 if args.device == "cuda" else 1
    if args.limit < 1 or args.repeats < 1:
        ap.error("--limit and --repeats: expected integers >= 1")
    out = args.out or str(Path(os.environ.get("OUT") or ".") / "end_to_end.json")
    check_output(ap, out)
    if args.device == "cpu":
        torch.set_num_threads(1)
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            rows = run(args)
    finally:
        gc.unfreeze()
    write_json(Path(out), rows, {"suite": "end_to_end", "seconds": time.perf_counter() - t0,
                                 "setup": {"limit": args.limit, "repeats": args.repeats,
                                           "max_new_tokens": args.max_new_tokens, "draft_budget": args.draft_budget,
                                           "tau": args.tau, "device": args.device,
                                           "compile_writes": args.compile_writes, "freeze_gc": args.freeze_gc}})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
