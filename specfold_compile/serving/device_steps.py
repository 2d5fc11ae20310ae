"""The engine's per-step bookkeeping as tensor ops over every request at once: ``Engine(loop="device")``.

Under ``loop="host"`` (the reference) each request's commit rule, acceptance walk and next drafts run in
Python on the host, one request after another (``request.RequestDecode.accept`` and ``rows``): host
work that grows with the requests of a step and sits between two forwards. Here they are
``decoding.device_step.step_from_confidences`` batched over the requests (``torch.vmap``), on the
confidences where the forward left them. Each pool slot keeps its request's next call in
``SlotSteps``' buffers on the model's device: rows ``[S, N, B]`` (row 0 the main state; rows past the
real ones copies of it), parents ``[S, N]``, real rows ``[S]`` and the block's [start, need] ``[S, 2]``.
One engine step:

1. ``load``: the first state of every block opened since the last step (one host-to-device copy);
2. ``forward_rows``: the ready requests' real rows gathered into the forward's rows (one
   ``index_select``); the forward computes the logits of each row's masked positions, as the host loop
   does (``host_rows``: the host's copy of each slot's next rows, which says which they are);
3. ``settle``: the confidences spread over the rows' positions (the unmasked ones zero, as the host loop
   lays them out) and padded to each kind's ``N`` (one scatter, one ``index_select``), the bookkeeping
   run once for every kind of decode in the step (``StepRules``: requests of the same params share one
   call), each request's next call written into its slot;
4. one read back, a small int64 tensor: each request's status word (``device_step.STATUS_FIELDS``), its
   next call's parents and rows (the next forward's layout, its main row the new state: whether and how
   its block ends, on the host).

The requests' own Python does no tensor work a step: it records the step and the new state it read.
Tokens and forwards are ``loop="host"``'s (tests/serving/test_device_steps.py); a choice between two
drafts whose scores agree to the last bit may differ (``device_step``'s module docstring), which
changes the forwards of a decode, never its tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..decoding.device_step import STATUS_FIELDS, DraftTables, StepRules, step_from_confidences
from .forward import row_bounds

__all__ = ["SlotSteps", "step_rules"]

_STATUS = len(STATUS_FIELDS)


def step_rules(decode) -> StepRules:
    """The ``StepRules`` of a ``RequestDecode`` (its params, mode and the model's rules)."""
    s = decode.scoring
    return StepRules(decode.block, s.sub_block_size, decode.mask_id, decode.eos, s.threshold, s.inclusive, s.dtype,
                     s.argmax_of_probs, decode.params.draft_budget if decode.spiffy else 0)


class SlotSteps:
    """The next call of every pool slot's request, on ``device`` (module docstring); ``slots``: the pool's
    slots, ``block``: the model's block size, ``graph``: the engine's draft graph (None: vanilla)."""

    def __init__(self, slots: int, block: int, device: torch.device, graph=None):
        self.block, self.device = block, device
        self.tables = None if graph is None or not len(graph) else DraftTables.from_graph(graph, device)
        self.rows = torch.zeros(slots, 1, block, dtype=torch.long, device=device)
        self.parents = torch.full((slots, 1), -1, dtype=torch.long, device=device)
        self.n_rows = torch.ones(slots, dtype=torch.long, device=device)
        self.info = torch.zeros(slots, 2, dtype=torch.long, device=device)
        self.counts = [1] * slots                      # host: real rows of each slot's next call
        self.next_parents: list[list[int]] = [[-1] for _ in range(slots)]  # host: their parents
        self.host_rows = [torch.zeros(1, block, dtype=torch.long) for _ in range(slots)]  # host: the rows
        self._opened: dict[int, tuple[int, int]] = {}  # slot -> (request, block) its buffers hold
        self._steps: dict[StepRules, object] = {}

    def _room(self, n: int) -> None:
        """At least ``n`` rows a slot (a request of a larger draft budget came)."""
        have = self.rows.shape[1]
        if n <= have:
            return
        rows = self.rows[:, :1].repeat(1, n, 1)
        rows[:, :have] = self.rows
        parents = torch.zeros(self.parents.shape[0], n, dtype=torch.long, device=self.device)
        parents[:, :have] = self.parents
        self.rows, self.parents = rows, parents

    def load(self, decodes) -> None:
        """Put the block each decode opened since its last step into its slot: the block's state in every
        row, parents ``[-1, 0, ...]``, one real row, its [start, need]."""
        fresh = [d for d in decodes if self._opened.get(d.slot) != (d.request_id, d.blocks)]
        if not fresh:
            return
        n = max([self.rows.shape[1]] + [1 + step_rules(d).draft_budget for d in fresh])
        self._room(n)
        b, f = self.block, len(fresh)
        host = torch.zeros(f, n * b + n + 3, dtype=torch.long)
        host[:, :n * b] = torch.stack([d.state for d in fresh]).repeat(1, n)
        host[:, n * b] = -1                                      # parents: -1, then 0 for the padding rows
        host[:, -3] = 1                                          # one real row
        host[:, -2:] = torch.tensor([[d.start, d.need] for d in fresh])
        rows, parents, n_rows, info = host.to(self.device).split([n * b, n, 1, 2], dim=1)
        slots = torch.tensor([d.slot for d in fresh], device=self.device)
        self.rows[slots] = rows.reshape(f, n, b)
        self.parents[slots] = parents
        self.n_rows[slots] = n_rows[:, 0]
        self.info[slots] = info
        for d in fresh:
            self._opened[d.slot] = (d.request_id, d.blocks)
            self.counts[d.slot], self.next_parents[d.slot] = 1, [-1]
            self.host_rows[d.slot] = d.state[None].clone()

    def logit_positions(self, decodes) -> list[Tensor]:
        """The flat positions ``n * B + p`` of each decode's next call whose logits it needs: its rows'
        masked positions (``RequestDecode.logit_positions``, the host loop's)."""
        return [d.logit_positions(self.host_rows[d.slot]) for d in decodes]

    def forward_rows(self, decodes) -> list[Tensor]:
        """The real rows of each decode's next call (int64 ``[N_i, B]`` views of one gathered tensor on the
        device, in ``decodes``' order)."""
        counts = [self.counts[d.slot] for d in decodes]
        width = self.rows.shape[1]
        first = torch.tensor([d.slot * width for d in decodes])
        index = torch.repeat_interleave(first, torch.tensor(counts)) + _ranks(counts)
        return list(self.rows.view(-1, self.block).index_select(0, index.to(self.device)).split(counts))

    def settle(self, decodes, positions: list[Tensor], conf: Tensor, tok: Tensor) -> list[tuple[list[int], Tensor]]:
        """The bookkeeping of the call ``forward_rows`` gave, on its confidences ``conf``/``tok`` at
        ``positions`` (``logit_positions``; flat, on the device): each decode's next call in its slot;
        returns, per decode, its status word (``STATUS_FIELDS`` then the call's real parents) and its new
        main state (int64 ``[B]``, host), after one read back; the next calls' layout is kept in
        ``counts``, ``next_parents`` and ``host_rows``."""
        b = self.block
        counts = [self.counts[d.slot] for d in decodes]
        bounds = torch.tensor(row_bounds(counts)[:-1])
        # the unmasked positions as the host loop leaves them: confidence 0, the mask token
        flat = torch.cat([p + int(at) * b for p, at in zip(positions, bounds)]).to(self.device)
        full_conf = torch.zeros(sum(counts) * b, dtype=conf.dtype, device=self.device)
        full_tok = torch.full((sum(counts) * b,), decodes[0].mask_id, dtype=tok.dtype, device=self.device)
        conf, tok = full_conf.index_put_((flat,), conf).view(-1, b), full_tok.index_put_((flat,), tok).view(-1, b)
        groups: dict[StepRules, list[int]] = {}
        for i, d in enumerate(decodes):
            groups.setdefault(step_rules(d), []).append(i)
        reads, widths = [], []
        for rules, members in groups.items():
            n = 1 + rules.draft_budget
            at = torch.tensor(members)
            # each request's rows, the padding rows taking its main row's confidences (never read)
            src = bounds[at][:, None] + torch.minimum(torch.arange(n)[None], torch.tensor(counts)[at][:, None] - 1)
            src = src.flatten().to(self.device)
            slots = torch.tensor([decodes[i].slot for i in members], device=self.device)
            shaped = (len(members), n, b)
            out = self._step(rules)(
                conf.index_select(0, src).view(shaped), tok.index_select(0, src).view(shaped), self.rows[slots, :n],
                self.parents[slots, :n], self.n_rows[slots], self.info[slots])
            next_rows, next_parents, next_n, status = out
            k = next_rows.shape[1]
            self.rows[slots, :k] = next_rows
            self.parents[slots, :k] = next_parents
            self.n_rows[slots] = next_n
            reads.append(torch.cat([status, next_parents, next_n[:, None], next_rows.flatten(1)], 1))
            widths.append((members, status.shape[1], k))
        host = torch.cat([r.flatten() for r in reads]).cpu()  # the step's one read back
        results: list = [None] * len(decodes)
        at = 0
        for (members, s, k), read in zip(widths, reads):
            part = host[at:at + read.numel()].view(read.shape)
            at += read.numel()
            for i, row in zip(members, part):
                n_next = int(row[s + k])
                status = row[:s].tolist()
                parents = row[s:s + n_next].tolist()
                next_rows = row[s + k + 1:].view(k, b)[:n_next].clone()
                results[i] = (status[:_STATUS] + status[_STATUS:_STATUS + status[3]], next_rows[0])
                slot = decodes[i].slot
                self.counts[slot], self.next_parents[slot], self.host_rows[slot] = n_next, parents, next_rows
        return results

    def _step(self, rules: StepRules):
        """The batched bookkeeping of one kind of decode (kept: one ``torch.vmap`` a kind)."""
        step = self._steps.get(rules)
        if step is None:
            tables = self.tables if rules.draft_budget else None

            def one(conf, tok, rows, parents, n_rows, info):
                return step_from_confidences(conf, tok, rows, parents, n_rows, info, rules, tables)

            step = self._steps[rules] = torch.vmap(one)
        return step


def _ranks(counts: list[int]) -> Tensor:
    """0, 1, ..., c - 1 for each count c, concatenated."""
    total = sum(counts)
    starts = torch.repeat_interleave(torch.tensor(row_bounds(counts)[:-1]), torch.tensor(counts))
    return torch.arange(total) - starts
