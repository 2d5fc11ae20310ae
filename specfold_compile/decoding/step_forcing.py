"""A decode recorded step for step, and replayed: what trace-driven benchmarks run at shapes whose weights
decode nothing meaningful.

A device-loop decode (``device_loop.decode_on_device(..., trace=...)``) makes two kinds of decision: each
step's outcome (on the device) and each block's seed (read on the host from the last write's logits).
``StepRecorder`` keeps both: per step a ``RecordedStep`` (the next call's rows, parents and real rows,
the step's status word and, from a SpecFold-compiled forward inside ``ops.fold_masks.recorded_fold_masks``,
every gate's fold mask), per block its seed. ``StepForcing`` holds a record on the device and, inside each
step (so inside its CUDA graph), replaces the step's outcome by the recorded one and loads the recorded
fold masks for its forward, and replaces each seed by the recorded one: the loop then makes exactly the
recorded calls, each doing the work the recorded call did (P4: given its masks a folded call's work and
output are fixed), whatever the logits say. The forward, the bookkeeping, the block writes, the seed's
read-back and every host step still run; only their decisions are the record's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .device_step import STATUS_FIELDS

__all__ = ["RecordedStep", "StepRecorder", "StepForcing", "snapshot", "recorded_gates"]


def recorded_gates(recorded: int, gates: int) -> Tensor:
    """Which of a record's ``recorded`` gates each of a replaying model's ``gates`` takes: gate ``g`` the
    record's gate ``g * recorded // gates`` (int64 [gates]), so a deeper model spreads the record's masks
    over its layers in order."""
    return torch.arange(gates) * recorded // gates


@dataclass
class RecordedStep:
    """One step (CPU tensors): the next call's ``rows`` [R, B], ``parents`` [R], real rows ``n_rows``,
    the step's ``status`` [len(STATUS_FIELDS) + R] and the fold ``masks`` [G, R, B] of its forward (None:
    no gate ran, e.g. an N = 1 call)."""

    rows: Tensor
    parents: Tensor
    n_rows: int
    status: Tensor
    masks: Tensor | None = None


def snapshot(buffers) -> RecordedStep:
    """The ``StepBuffers`` after a step, copied to the host."""
    return RecordedStep(buffers.rows.cpu().clone(), buffers.parents.cpu().clone(), int(buffers.n_rows[0]),
                        buffers.status.cpu().clone())


class StepRecorder:
    """Records a launched (eager) device-loop decode: ``steps`` and ``seeds``. ``masks``: the list that
    ``ops.fold_masks.recorded_fold_masks()`` yields, when the forward is SpecFold-compiled (each step then
    keeps its gates' masks, padded to the buffers' rows)."""

    def __init__(self, masks: list | None = None):
        self.masks = masks
        self.steps: list[RecordedStep] = []
        self.seeds: list[int] = []

    def before(self) -> None:
        pass

    def after(self, buffers, ran: Tensor) -> None:
        if not bool(ran):  # a step launched after its block's last: nothing to record (a read, as snapshots)
            return
        step = snapshot(buffers)
        if self.masks:  # this step's forward: one [N, B] mask per gate
            by_gate = torch.stack([m.cpu() for _, m in self.masks])
            step.masks = torch.zeros((by_gate.shape[0],) + tuple(step.rows.shape), dtype=torch.bool)
            step.masks[:, :by_gate.shape[1]] = by_gate
            self.masks.clear()
        self.steps.append(step)

    def seed(self, token: int) -> int:
        self.seeds.append(token)
        return token


class StepForcing:
    """``steps`` forced, in order, on a ``DeviceDecoder``'s steps, and ``seeds`` on the blocks' seeds (both
    as ``StepRecorder`` keeps them; a record of several decodes is their lists concatenated, each decode
    started with ``seek``). ``token_map`` ([V_recorded] int64): the recorded token ids in the replaying
    model's vocabulary (mask and eos included). ``gates``: the
    replaying model's gate count; gate ``g`` gets the recorded mask of gate ``g * G_recorded // gates``.
    ``fold_masks`` is the buffer to pass to ``ops.fold_masks.forced_fold_masks``; ``index`` the next
    step's position in ``steps`` (on the device, advanced by each step)."""

    def __init__(self, steps: list[RecordedStep], seeds: list[int], device: torch.device,
                 token_map: Tensor | None = None, gates: int = 0):
        if not steps:
            raise ValueError("steps: expected at least one recorded step")
        self.seeds = list(seeds) if token_map is None else token_map[torch.tensor(seeds, dtype=torch.long)].tolist()
        self.seed_index = 0
        rows = torch.stack([s.rows for s in steps])
        if token_map is not None:
            rows = token_map[rows]
        self.rows = rows.to(device)
        self.parents = torch.stack([s.parents for s in steps]).to(device)
        self.n_rows = torch.tensor([s.n_rows for s in steps], dtype=torch.long, device=device)
        status = torch.stack([s.status for s in steps])
        if status.shape[1] != len(STATUS_FIELDS) + rows.shape[1]:
            raise ValueError(f"steps: status words of {status.shape[1]} entries, expected {len(STATUS_FIELDS)} fields "
                             f"{STATUS_FIELDS} and {rows.shape[1]} parents: a record of another layout; record it again")
        if token_map is not None:  # the seed guess is a token id
            guess = STATUS_FIELDS.index("seed_guess")
            status[:, guess] = token_map[status[:, guess]]
        self.status = status.to(device)
        self.index = torch.zeros(1, dtype=torch.long, device=device)
        self.steps = len(steps)
        R, B = self.rows.shape[1:]
        recorded = [s.masks for s in steps if s.masks is not None]
        self.fold_masks = torch.zeros((max(gates, 1), R, B), dtype=torch.bool, device=device)
        if recorded and gates:
            g_rec = recorded[0].shape[0]
            pick = recorded_gates(g_rec, gates)
            empty = torch.zeros((g_rec, R, B), dtype=torch.bool)
            masks = torch.stack([empty if s.masks is None else s.masks for s in steps])
            self.masks = masks[:, pick].to(device)
        else:
            self.masks = None

    def seek(self, step: int, seed: int) -> None:
        """The next decode replays from record step ``step`` and seed ``seed``."""
        self.index.fill_(step)
        self.seed_index = seed

    def seed(self, token: int) -> int:
        """A block's seed (on the host): the recorded one in place of ``token``."""
        if self.seed_index >= len(self.seeds):
            raise RuntimeError(f"the replay reads seed {self.seed_index + 1} of a record of {len(self.seeds)}")
        self.seed_index += 1
        return self.seeds[self.seed_index - 1]

    def before(self) -> None:
        """Inside a step, before its forward: the recorded fold masks of this step."""
        if self.masks is not None:
            self.fold_masks.copy_(self.masks.index_select(0, self.index.clamp(max=self.steps - 1))[0])

    def after(self, buffers, ran: Tensor) -> None:
        """Inside a step, after its bookkeeping: the recorded outcome, and on to the next step; a step
        that did not run (``ran``, bool [], false: launched after its block's last) forces nothing."""
        i = self.index.clamp(max=self.steps - 1)  # a replay that overruns its record repeats the last step
        for kept, recorded in ((buffers.rows, self.rows), (buffers.parents, self.parents),
                               (buffers.n_rows, self.n_rows[:, None]), (buffers.status, self.status)):
            kept.copy_(torch.where(ran, recorded.index_select(0, i)[0], kept))
        self.index.add_(ran.long())
