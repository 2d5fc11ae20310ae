"""What a decode returns (``GenerateResult``, one ``StepStats`` a verification step) and the model constants
every decode loop reads (``model_consts``): shared by the Python loop (``decoder``), the device loop
(``device_loop``) and the serving engine."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["StepStats", "GenerateResult", "model_consts"]


@dataclass
class StepStats:
    """One verification step: a ``model(...)`` call, or (``fused``) a block's first state verified by the
    pass that wrote the prefix before it (``generate(fuse_boundaries=True)``)."""

    branches: int                  # rows N of the call (1 = main only)
    accepted: int                  # draft rows accepted after the call
    parents: list[int]             # the parents vector passed to the model (parents[0] = -1)
    rows: torch.Tensor | None = None  # CPU int64 [N, B] tokens of the call (for benchmark replay)
    fused: bool = False            # verified by the pass that wrote the prefix before it (no call of its own)


@dataclass
class GenerateResult:
    tokens: list[int]
    nfe: int
    wall_time_s: float
    steps: list[StepStats] = field(default_factory=list)
    mode: str = "vanilla"
    blocks: int = 0                # blocks decoded (started)
    graph_captures: int = 0        # cuda_graphs: verification shapes captured in this call (first calls)
    graph_replays: int = 0         # cuda_graphs: verification calls replayed from a captured graph

    @property
    def num_calls(self) -> int:
        return len(self.steps)

    @property
    def accepted_per_call(self) -> float:
        return sum(s.accepted for s in self.steps) / len(self.steps) if self.steps else 0.0

    @property
    def branches_per_call(self) -> float:
        return sum(s.branches for s in self.steps) / len(self.steps) if self.steps else 0.0

    @property
    def calls(self) -> list[tuple[int, list[int]]]:
        """``(N, parents)`` of every verification call, in order (for benchmark replay)."""
        return [(s.branches, list(s.parents)) for s in self.steps]

    @property
    def tokens_per_call(self) -> float:
        return len(self.tokens) / len(self.steps) if self.steps else 0.0


def model_consts(model) -> tuple[int, int | None, int, int]:
    """``(block_size, sub_block_size, mask_token_id, eos_token_id)`` of ``model.config``, checked."""
    cfg = model.config
    B = int(cfg.block_size)
    sb = cfg.sub_block_size
    sb = None if sb is None else int(sb)
    if B < 2:
        raise ValueError(f"model.config.block_size must be >= 2, got {B}")
    if sb is not None and sb < 1:
        raise ValueError(f"model.config.sub_block_size must be None or >= 1, got {sb}")
    return B, sb, int(cfg.mask_token_id), int(cfg.eos_token_id)
