"""The ``specfold`` command: its subcommands, their arguments, and the one-line handling of user errors."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import arguments, delegated
from .cuda_graphs import add_cuda_graphs_argument, check_cuda_graphs_argument
from .options import KERNELS, add_model_arguments

EPILOG = """User errors (a bad value, a missing file, an output that cannot be written, a missing optional
package) print one line and exit with status 2 before any work; SPECFOLD_TRACEBACK=1 shows their
traceback. Optional packages: specfold-compile[plot] (sweep.png), [hf] (chat templates through
transformers), [triton] (--kernels triton); [all] installs every one."""


def add_decoding_arguments(p) -> None:
    """The arguments of ``generate`` and ``demo``."""
    add_model_arguments(p)
    p.add_argument("--tau", type=arguments.tau, default=0.1)
    p.add_argument("--fuse-boundaries", nargs="?", const=True, default=False, choices=("writes",),
                   help="verify each block's first state in the pass that writes the prefix before it "
                        "(generate(fuse_boundaries=True)): the same tokens, fewer forwards; "
                        "'--fuse-boundaries writes': the block writes only, not the prompt's prefill")
    p.add_argument("--loop", choices=("host", "device"), default="host",
                   help="each step's bookkeeping in Python (host) or as tensor ops on the model's device, one "
                        "CUDA graph a step with --cuda-graphs (generate(loop='device')): the same tokens")
    add_cuda_graphs_argument(p)


def build_parser() -> argparse.ArgumentParser:
    from .demo import cmd_demo  # noqa: PLC0415
    from .dump import check_dump_inputs, cmd_dump  # noqa: PLC0415
    from .generate import check_generate_inputs, cmd_generate  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="specfold", description="SpecFold: folded speculative verification "
                                 "for block-diffusion LMs", epilog=EPILOG)
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="decode one prompt and print text and statistics, or many prompts "
                                        "together (--prompts-file) and print a JSON line each")
    add_decoding_arguments(p)
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt")
    prompt.add_argument("--prompts-file", metavar="FILE",
                        help="JSON Lines, a prompt a line (a string, or an object with a \"prompt\" string): "
                             "decoded together by the serving engine, each as it decodes alone")
    p.add_argument("--max-requests", type=arguments.positive_int, default=None,
                   help="--prompts-file: the engine's slots, the rest waiting their turn (default: every prompt)")
    p.add_argument("--mode", choices=("vanilla", "spiffy", "specfold"), default="spiffy")
    p.add_argument("--compile-writes", action="store_true",
                   help="specfold mode: also compile the prefill and block writes (torch.compile, default backend)")
    p.set_defaults(fn=cmd_generate, check=check_generate_inputs)

    p = sub.add_parser("demo", help="vanilla vs Spiffy vs SpecFold on the shipped model, one prompt per task; "
                                    "prints the committed GPU results next to its own")
    add_decoding_arguments(p)
    p.add_argument("--gpu-results", default=None,
                   help="folder of committed GPU results to quote (default: the repository's bench/results/h200)")
    p.set_defaults(fn=cmd_demo, check=arguments.check_model_inputs)

    p = sub.add_parser("dump", help="graph before/after every pass plus the region report")
    p.add_argument("--model", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--tau", type=arguments.tau, default=0.1)
    p.add_argument("--branches", type=arguments.positive_int, default=5)
    p.add_argument("--kernels", default="auto", choices=KERNELS)
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"))
    p.add_argument("--device", type=arguments.device, default="cpu")
    p.set_defaults(fn=cmd_dump, check=check_dump_inputs)

    for name in delegated.TARGETS:
        p = sub.add_parser(name, add_help=False, help=f"see `specfold {name} --help`")
        p.set_defaults(fn=None)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run ``specfold ARGV``; returns the exit status (user errors exit with status 2, see ``EPILOG``)."""
    ap = build_parser()
    args, rest = ap.parse_known_args(argv)
    prog = f"specfold {args.command}"
    with arguments.reporting_user_errors(prog), arguments.one_line_warnings():
        if args.fn is None:
            delegated.check_arguments(args.command, rest)
            module, func = delegated.TARGETS[args.command].split(":")
            return int(getattr(importlib.import_module(module), func)(rest) or 0)
        if rest:
            ap.error(f"unrecognized arguments: {' '.join(rest)}")
        if hasattr(args, "cuda_graphs"):
            check_cuda_graphs_argument(ap, args.cuda_graphs, args.device)
        args.check(args)
        return int(args.fn(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
