"""The arguments several commands share, with the decoding defaults (``decoding.DEFAULTS``), and the
checks of what they need installed."""

from __future__ import annotations

from ..decoding.defaults import DEFAULTS
from . import arguments

KERNELS = ("auto", "torch", "triton")


def add_model_arguments(p) -> None:
    """``--model``, ``--max-new-tokens``, ``--threshold``, ``--draft-budget``, ``--draft-graph``,
    ``--device``, ``--no-chat-template``: every command that decodes."""
    p.add_argument("--model", default=None, help="checkpoint dir or preset (default: the shipped model)")
    p.add_argument("--max-new-tokens", type=arguments.positive_int, default=DEFAULTS.max_new_tokens)
    p.add_argument("--threshold", type=arguments.threshold, default=DEFAULTS.threshold)
    p.add_argument("--draft-budget", type=arguments.nonnegative_int, default=DEFAULTS.draft_budget)
    p.add_argument("--draft-graph", default=None,
                   help="draft graph JSON (default: the model's calibrated draft_graph.json, else decoding's "
                        "default; `specfold calibrate` writes one)")
    p.add_argument("--device", type=arguments.device, default="cpu")
    p.add_argument("--no-chat-template", action="store_true",
                   help="send prompts as they are even when the checkpoint's tokenizer has a chat template")


def add_kernels_argument(p, default: str = "auto") -> None:
    p.add_argument("--kernels", default=default, choices=KERNELS,
                   help="the folded regions' kernels: auto (Triton on CUDA, torch elsewhere), triton (needs "
                        "specfold-compile[triton]) or torch (the readable references; a CUDA graph cannot "
                        "capture them)")


def check_kernels(kernels: str) -> None:
    """``--kernels triton`` needs Triton installed; checked before anything loads."""
    if kernels == "triton":
        arguments.require_module("triton", "--kernels triton", "triton", "pass --kernels torch")
