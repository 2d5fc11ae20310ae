"""``specfold generate``: decode one prompt and print its text and statistics (many prompts:
``--prompts-file``, ``generate_batch.py``).

What compiles (SpecFold's backend, ``--compile-writes``) or captures (``--cuda-graphs``) does so in a
first run; the statistics and tokens/s are those of a second, warm run, and the first run's seconds are
reported on their own (``first_run_s``), so tokens/s never counts compile time.
"""

from __future__ import annotations

import sys
import time

import torch

from ..eval.run import verify_graphs
from ..loading import decode, encode, load_model, resolve_draft_graph
from .arguments import UsageError, check_model_inputs
from .generate_batch import check_batch_arguments, cmd_generate_batch


def compiled(model, tau: float, kernels: str = "auto"):
    """The model compiled with the SpecFold backend (the command line's compile path)."""
    return torch.compile(model, backend="specfold", options={"tau": tau, "kernels": kernels})


def run_mode(model, prompt_ids, mode: str, args, specfold_model=None, graphs=None):
    """One ``generate`` call in ``mode`` (vanilla, spiffy or specfold: Spiffy on ``specfold_model``).
    ``graphs``: {target id: VerifyGraphs} of ``--cuda-graphs``, one per target (vanilla and Spiffy share
    the eager model's), filled on first use and kept across calls."""
    from ..decoding import generate  # noqa: PLC0415

    target = specfold_model if mode == "specfold" else model
    cuda_graphs = False
    if args.cuda_graphs is not None:
        graphs = {} if graphs is None else graphs
        if id(target) not in graphs:
            graphs[id(target)] = verify_graphs(args.cuda_graphs, target, args.device)
        cuda_graphs = graphs[id(target)]
    return generate(target, prompt_ids, mode="vanilla" if mode == "vanilla" else "spiffy",
                    max_new_tokens=args.max_new_tokens, threshold=args.threshold,
                    draft_budget=args.draft_budget, draft_graph=resolve_draft_graph(args.model, args.draft_graph),
                    compile_writes=mode == "specfold" and getattr(args, "compile_writes", False),
                    cuda_graphs=cuda_graphs, fuse_boundaries=getattr(args, "fuse_boundaries", False),
                    loop=getattr(args, "loop", "host"))


def warms_up(args) -> bool:
    """Whether the first run compiles or captures, so that a second run is the one timed."""
    return args.mode == "specfold" or args.cuda_graphs is not None


def check_generate_inputs(args) -> None:
    """Before anything loads: the model's inputs, and with ``--prompts-file`` the file and the options the
    batched engine takes."""
    check_model_inputs(args)
    if args.prompts_file is not None:
        check_batch_arguments(args)
    elif args.max_requests is not None:
        raise UsageError("--max-requests: only with --prompts-file (the engine's slots)")


def cmd_generate(args) -> int:
    if args.prompts_file is not None:
        return cmd_generate_batch(args)
    model = load_model(args.model, device=args.device, chat_template=not args.no_chat_template)
    ids = encode(model, args.prompt).to(args.device)
    specfold_model = compiled(model, args.tau) if args.mode == "specfold" else None
    graphs: dict = {}
    first_run_s, captures = None, 0
    if warms_up(args):
        t0 = time.perf_counter()
        first = run_mode(model, ids, args.mode, args, specfold_model, graphs)
        first_run_s, captures = time.perf_counter() - t0, first.graph_captures
    res = run_mode(model, ids, args.mode, args, specfold_model, graphs)
    print(decode(model, res.tokens))
    graph_stats = "" if args.cuda_graphs is None else \
        f" graph_captures={captures + res.graph_captures} graph_replays={res.graph_replays}"
    first_run = "" if first_run_s is None else f" first_run_s={first_run_s:.3f}"
    print(f"\nmode={args.mode} tokens={len(res.tokens)} nfe={res.nfe} time={res.wall_time_s:.3f}s "
          f"tokens/s={len(res.tokens) / max(res.wall_time_s, 1e-9):.1f} calls={res.num_calls} "
          f"accepted/call={res.accepted_per_call:.2f} branches/call={res.branches_per_call:.2f}{graph_stats}{first_run}")
    if first_run_s is not None:
        did = " and ".join(w for w, on in (("compiled", args.mode == "specfold"),
                                           ("captured the graphs", args.cuda_graphs is not None)) if on)
        print(f"time and tokens/s: a warm run; first_run_s: the first run, which {did}", file=sys.stderr)
    return 0
