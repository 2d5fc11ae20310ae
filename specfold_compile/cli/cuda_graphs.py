"""``--cuda-graphs [cuda|eager]``: the argument and its check against ``--device``, before anything loads."""

from __future__ import annotations

import torch

from ..decoding.cuda_graphs import REPLAYS


def add_cuda_graphs_argument(parser) -> None:
    """The command line's ``--cuda-graphs [cuda|eager]`` (``specfold generate / demo / eval``)."""
    parser.add_argument("--cuda-graphs", nargs="?", const="cuda", default=None, choices=REPLAYS,
                        help="replay every verification call and block write from a CUDA graph (generate's "
                             "cuda_graphs; needs --device cuda); 'eager': the same static-cache bookkeeping "
                             "with the model called instead (CPU; bisecting a wrong result)")


def check_cuda_graphs_argument(parser, replay: str | None, device: str) -> None:
    """``parser.error`` before anything loads when ``--cuda-graphs`` cannot run on ``--device``."""
    if replay == "cuda" and torch.device(device).type != "cuda":
        parser.error(f"--cuda-graphs: CUDA graphs need --device cuda, got --device {device} "
                     f"(--cuda-graphs eager runs the same loop without graphs)")
