"""What the engine hands out and keeps: a finished block (``BlockOutput``), a request's record
(``RequestOutput``) and the engine's counts (``EngineStats``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..decoding import GenerateResult

__all__ = ["BlockOutput", "RequestOutput", "EngineStats", "STATUSES"]

STATUSES = ("waiting", "running", "finished", "failed", "aborted")


@dataclass(frozen=True)
class BlockOutput:
    """One finished block of one request, as ``step`` hands it out. ``index``: the request's block number
    (0-based); ``finished``: the request's last output (then ``status`` says how it ended). A request
    that fails gives one last output with no tokens, ``index`` the block it was decoding and ``error``
    set."""

    request_id: int
    index: int
    tokens: list[int]
    finished: bool
    status: str = "running"
    error: str | None = None


@dataclass
class RequestOutput:
    """A request's record: ``status`` (one of ``STATUSES``), its finished blocks so far, and once finished
    ``result`` (a ``decoding.GenerateResult``, as ``generate`` on that request alone returns it) or
    ``error`` (failed). ``fold_masks`` (``mode="specfold"``): each of its verification calls' fold masks,
    bool ``[G, N, B]`` (G gates: one a decoder layer; N the call's rows, ``result.steps``' branches), in
    call order."""

    request_id: int
    status: str
    blocks: list[list[int]] = field(default_factory=list)
    result: GenerateResult | None = None
    error: str | None = None
    fold_masks: list[torch.Tensor] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return [t for block in self.blocks for t in block]


@dataclass
class EngineStats:
    """What the engine ran: verification forwards (and the rows and requests they covered), batched block
    writes, prefills; under SpecFold the draft positions its gates saw (summed over gates) and folded,
    and (``cuda_graphs``) the replays of a forward that overflowed a graph's packed rows, each replayed
    again from the next capacity level's graph, and the calls whose rows the host built while a block
    write ran on the device (``Engine._rows_ahead``)."""

    verify_calls: int = 0
    verify_rows: int = 0
    verify_requests: int = 0
    write_calls: int = 0
    written_blocks: int = 0
    prefills: int = 0
    gated_draft_positions: int = 0
    folded_draft_positions: int = 0
    overflows: int = 0
    rows_built_ahead: int = 0

    @property
    def recompute_ratio(self) -> float:
        """SpecFold: the share of gated draft positions computed rather than folded (1.0 before any)."""
        gated = self.gated_draft_positions
        return 1.0 - self.folded_draft_positions / gated if gated else 1.0
