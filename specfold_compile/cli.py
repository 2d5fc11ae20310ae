"""``specfold`` command line: generate, demo, dump, calibrate, eval, sweep, train."""

from __future__ import annotations

import argparse
import sys
import time

import torch

from . import arguments
from .decoding.cuda_graphs import add_cuda_graphs_argument, check_cuda_graphs_argument
from .decoding.defaults import DEFAULTS
from .loading import decode, encode, load_model, resolve_draft_graph


def demo_prompts() -> list[str]:
    """The first held-out test problem of each task (what the shipped model was trained for)."""
    from .tasks import TASKS, sample

    return [sample(task, "test", 1, 0)[0].prompt for task in TASKS]


def _compiled(model, tau: float, kernels: str = "auto"):
    return torch.compile(model, backend="specfold", options={"tau": tau, "kernels": kernels})


def _run(model, prompt_ids, mode: str, args, compiled=None, graphs=None):
    """One ``generate`` call; ``graphs``: {target id: VerifyGraphs} of ``--cuda-graphs``, one per target
    (vanilla and Spiffy share the eager model's), filled on first use and kept across prompts."""
    from .decoding import generate
    from .decoding.cuda_graphs import graphs_for_cli

    target = compiled if mode == "specfold" else model
    cuda_graphs = False
    if args.cuda_graphs is not None:
        if graphs is None:
            graphs = {}
        if id(target) not in graphs:
            graphs[id(target)] = graphs_for_cli(args.cuda_graphs, target, args.device)
        cuda_graphs = graphs[id(target)]
    return generate(target, prompt_ids, mode="vanilla" if mode == "vanilla" else "spiffy",
                    max_new_tokens=args.max_new_tokens, threshold=args.threshold,
                    draft_budget=args.draft_budget, draft_graph=resolve_draft_graph(args.model, args.draft_graph),
                    compile_writes=mode == "specfold" and getattr(args, "compile_writes", False),
                    cuda_graphs=cuda_graphs)


def cmd_generate(args) -> int:
    model = load_model(args.model, device=args.device, chat_template=not args.no_chat_template)
    ids = encode(model, args.prompt).to(args.device)
    compiled = _compiled(model, args.tau) if args.mode == "specfold" else None
    res = _run(model, ids, args.mode, args, compiled)
    print(decode(model, res.tokens))
    graphs = "" if args.cuda_graphs is None else \
        f" graph_captures={res.graph_captures} graph_replays={res.graph_replays}"
    print(f"\nmode={args.mode} tokens={len(res.tokens)} nfe={res.nfe} time={res.wall_time_s:.3f}s "
          f"tokens/s={len(res.tokens) / max(res.wall_time_s, 1e-9):.1f} calls={res.num_calls} "
          f"accepted/call={res.accepted_per_call:.2f} branches/call={res.branches_per_call:.2f}{graphs}")
    return 0


def cmd_demo(args) -> int:
    from .backend import collect_stats

    model = load_model(args.model, device=args.device, chat_template=not args.no_chat_template)
    compiled = _compiled(model, args.tau)
    print(f"model: {getattr(model, 'name_or_path', args.model or 'tiny-fast-dllm-v2 (random)')}")
    rows = []
    prompts = demo_prompts()
    graphs: dict = {}  # --cuda-graphs: one VerifyGraphs per target, captured in the first pass
    for mode in ("vanilla", "spiffy", "specfold"):
        # A first pass over the prompts compiles every shape (SpecFold); the table times the second.
        t0 = time.perf_counter()
        for prompt in prompts:
            _run(model, encode(model, prompt).to(args.device), mode, args, compiled, graphs)
        warm = time.perf_counter() - t0
        toks = nfe = calls = accepted = 0
        wall = 0.0
        ratio_num = ratio_den = 0.0
        outputs = []
        for prompt in prompts:
            with collect_stats() as s:
                res = _run(model, encode(model, prompt).to(args.device), mode, args, compiled, graphs)
            toks += len(res.tokens)
            nfe += res.nfe
            calls += res.num_calls
            accepted += sum(st.accepted for st in res.steps)
            wall += res.wall_time_s
            outputs.append(res.tokens)
            if mode == "specfold" and s.layers:
                ratio_num += sum(layer.computed_draft_rows for layer in s.layers)
                ratio_den += sum(layer.draft_rows for layer in s.layers)
        ratio = f"{ratio_num / ratio_den:.2f}" if ratio_den else "-"
        rows.append((mode, toks, nfe, toks / max(wall, 1e-9), accepted / max(calls, 1), ratio, warm, outputs))
    print(f"\n{'mode':<9} {'tokens':>6} {'NFE':>5} {'tokens/s':>9} {'accepted/call':>14} {'recompute':>9} "
          f"{'first pass s':>12}")
    for mode, toks, nfe, tps, acc, ratio, warm, _ in rows:
        print(f"{mode:<9} {toks:>6} {nfe:>5} {tps:>9.1f} {acc:>14.2f} {ratio:>9} {warm:>12.2f}")
    same = rows[0][7] == rows[1][7]
    print(f"\nSpiffy tokens identical to vanilla (lossless): {same}")
    for prompt, out in zip(prompts, rows[0][7]):
        print(f"\n> {prompt}\n{decode(model, out)[:300]}")
    return 0 if same else 1


def cmd_dump(args) -> int:
    model = load_model(args.model, device=args.device, dtype=getattr(torch, args.dtype) if args.dtype else None)
    cfg = model.config
    cache = model.prefill(torch.arange(1, 9, dtype=torch.int64) % cfg.vocab_size)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (1, cfg.block_size), generator=gen).repeat(args.branches, 1)
    tokens[tokens == cfg.mask_token_id] = 0
    for n in range(1, args.branches):
        tokens[n, n % cfg.block_size] = cfg.mask_token_id
    parents = torch.tensor([-1] + [(n - 1) // 2 for n in range(1, args.branches)], dtype=torch.int64)
    compiled = torch.compile(model, backend="specfold",
                             options={"tau": args.tau, "dump_dir": args.out, "kernels": args.kernels})
    compiled(tokens, parents, cache)
    print(f"graph dumps and region report written to {args.out}")
    return 0


def check_dump_inputs(args) -> None:
    arguments.model_config(args.model)
    arguments.output_dir(args.out, "--out")


# Output arguments of the commands whose parsers live elsewhere, checked before they start.
DELEGATED_OUTPUTS = {"calibrate": (("--out", arguments.output_file), ("--traces-out", arguments.output_file)),
                     "train": (("--out", arguments.output_dir),)}


def check_delegated_outputs(command: str, rest: list[str]) -> None:
    pairs = DELEGATED_OUTPUTS.get(command, ())
    if not pairs or "-h" in rest or "--help" in rest:
        return
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag, _ in pairs:
        ap.add_argument(flag, default=None)
    known, _ = ap.parse_known_args(rest)
    for flag, check in pairs:
        value = getattr(known, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            check(value, flag)


def add_decoding_arguments(p) -> None:
    """The arguments of every decoding command, with the shared defaults (``decoding.DEFAULTS``)."""
    p.add_argument("--model", default=None, help="checkpoint dir or preset (default: the shipped model)")
    p.add_argument("--max-new-tokens", type=arguments.positive_int, default=DEFAULTS.max_new_tokens)
    p.add_argument("--threshold", type=arguments.threshold, default=DEFAULTS.threshold)
    p.add_argument("--draft-budget", type=arguments.nonnegative_int, default=DEFAULTS.draft_budget)
    p.add_argument("--draft-graph", default=None, help="draft graph JSON (specfold calibrate)")
    p.add_argument("--tau", type=arguments.tau, default=0.1)
    p.add_argument("--device", type=arguments.device, default="cpu")
    p.add_argument("--no-chat-template", action="store_true",
                   help="send the prompt as it is even when the checkpoint's tokenizer has a chat template")
    add_cuda_graphs_argument(p)


def main(argv: list[str] | None = None) -> int:
    """User errors (a bad value, a missing file, an output that cannot be written) print one line and
    exit with status 2 before any work (``arguments``); ``SPECFOLD_TRACEBACK=1`` shows their traceback."""
    ap = argparse.ArgumentParser(prog="specfold", description="SpecFold: folded speculative verification "
                                 "for block-diffusion LMs", epilog=main.__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="decode one prompt and print text and statistics")
    add_decoding_arguments(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--mode", choices=("vanilla", "spiffy", "specfold"), default="spiffy")
    p.add_argument("--compile-writes", action="store_true",
                   help="specfold mode: also compile the prefill and block writes (torch.compile, default backend)")
    p.set_defaults(fn=cmd_generate, check=arguments.check_model_inputs)

    p = sub.add_parser("demo", help="vanilla vs Spiffy vs SpecFold on a tiny model, a few prompts")
    add_decoding_arguments(p)
    p.set_defaults(fn=cmd_demo, check=arguments.check_model_inputs)

    p = sub.add_parser("dump", help="graph before/after every pass plus the region report")
    p.add_argument("--model", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--tau", type=arguments.tau, default=0.1)
    p.add_argument("--branches", type=arguments.positive_int, default=5)
    p.add_argument("--kernels", default="torch", choices=("auto", "torch", "triton"))
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"))
    p.add_argument("--device", type=arguments.device, default="cpu")
    p.set_defaults(fn=cmd_dump, check=check_dump_inputs)

    for name, target in (("calibrate", "specfold_compile.decoding:calibrate_cli"),
                         ("eval", "specfold_compile.evaluation:eval_cli"),
                         ("sweep", "specfold_compile.evaluation:sweep_cli"),
                         ("train", "specfold_compile.training:train_cli")):
        p = sub.add_parser(name, add_help=False, help=f"see `specfold {name} --help`")
        p.set_defaults(fn=None, target=target)

    args, rest = ap.parse_known_args(argv)
    prog = f"specfold {args.command}"
    with arguments.reporting_user_errors(prog), arguments.one_line_warnings():
        if args.fn is None:
            import importlib

            check_delegated_outputs(args.command, rest)
            module, func = args.target.split(":")
            return int(getattr(importlib.import_module(module), func)(rest) or 0)
        if rest:
            ap.error(f"unrecognized arguments: {' '.join(rest)}")
        if hasattr(args, "cuda_graphs"):
            check_cuda_graphs_argument(ap, args.cuda_graphs, args.device)
        args.check(args)
        return int(args.fn(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
