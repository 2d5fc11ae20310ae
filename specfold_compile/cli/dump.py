"""``specfold dump``: the graph before and after every pass, plus the region report, for one call."""

from __future__ import annotations

import torch

from ..loading import load_model
from . import arguments
from .options import check_kernels


def check_dump_inputs(args) -> None:
    arguments.model_config(args.model)
    arguments.output_dir(args.out, "--out")
    check_kernels(args.kernels)


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
    specfold_model = torch.compile(model, backend="specfold",
                                   options={"tau": args.tau, "dump_dir": args.out, "kernels": args.kernels})
    specfold_model(tokens, parents, cache)
    print(f"graph dumps and region report written to {args.out}")
    return 0
