"""The engine's per-step bookkeeping as tensor ops over every request at once: ``Engine(loop="device")``.

Under ``loop="host"`` (the reference) each request's commit rule, acceptance walk and next drafts run in
Python on the host, one request after another (``request.RequestDecode.accept`` and ``rows``): host
work that grows with the requests of a step and sits between two forwards. Here they are
``decoding.device_step.step_from_confidences`` batched over the requests (``torch.vmap``), on the
confidences where the forward left them. Each pool slot keeps its request's next call in
``SlotSteps``' buffers on the model's device: rows ``[S, N, B]`` (row 0 the main state; rows past the
real ones copies of it), parents ``[S, N]``, real rows ``[S]`` and the block's [start, need] ``[S, 2]``.
One engine step:

1. ``load``: the first state of every block opened since the last step (one host-to-device copy); with
   the engine's ``max_verify_rows``, ``keep_drafts``: each call cut to its request's share of the rows;
2. ``forward_rows``: the ready requests' real rows gathered into the forward's rows (one
   ``index_select``); the forward computes the logits of each row's masked positions, as the host loop
   does (``host_rows``: the host's copy of each slot's next rows, which says which they are);
3. ``settle``: the confidences spread over the rows' positions (the unmasked ones zero, as the host loop
   lays them out) and padded to each kind's ``N`` (one scatter, one ``index_select``), the bookkeeping
   run once for every kind of decode in the step (``StepRules``: requests of the same params share one
   call), each request's next call written into its slot;
4. one read back, a small int64 tensor: each request's status word (``device_step.STATUS_FIELDS``), its
   next call's parents and rows (the next forward's layout, its main row the new state: whether and how
   its block ends, on the host) and its drafts' order (``keep_drafts``).

With the engine's ``cuda_graphs`` (``SlotSteps(replay="cuda")``) step 3 is one CUDA graph a kind of
decode, captured on first use per padded request count (a power of two; padding requests step a spare
slot past the pool's) and padded row count (``graphs.row_bucket``): a replay costs the copy of the
confidences into the graph's buffers, one host-to-device copy of the index inputs and the launch, where
launched it is a kernel for every tensor op of the walk and the pruning loops (``replay="eager"``: the
same buffers, ``_group`` called again; the CPU path). There each kind's vmapped bookkeeping is compiled
first (``compile_step``, on by default on CUDA; launched, the compiled step runs on the same padded
buffers): Inductor fuses its few hundred small ops, which would otherwise be a kernel each.

The requests' own Python does no tensor work a step: it records the step and the new state it read.
Tokens and forwards are ``loop="host"``'s (tests/serving/test_device_steps.py); a choice between two
drafts whose scores agree to the last bit may differ (``device_step``'s module docstring), which
changes the forwards of a decode, never its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..decoding.commit import spread_confidences
from ..decoding.graph_capture import record_call
from ..decoding.device_step import (STATUS_FIELDS, CompiledStep, DraftTables, StepRules, prefix_of_drafts,
                                    step_from_confidences)
from .forward import row_bounds
from .graphs import request_bucket, row_bucket, split_folds

__all__ = ["SlotSteps", "step_rules", "share_drafts"]

_STATUS = len(STATUS_FIELDS)


def step_rules(decode) -> StepRules:
    """The ``StepRules`` of a ``RequestDecode`` (its params, mode and the model's rules)."""
    s = decode.scoring
    return StepRules(decode.block, s.sub_block_size, decode.mask_id, decode.eos, s.threshold, s.inclusive, s.dtype,
                     s.argmax_of_probs, decode.params.draft_budget if decode.spiffy else 0)


def share_drafts(decodes, max_rows: int, take) -> None:
    """``Engine(max_verify_rows=max_rows)``'s allocation (``Engine.rows_for``): the mains first, then the
    decodes in turn, ``take(d, share)`` giving decode ``d`` at most an even ``share`` of the rows still
    free and returning how many drafts it took."""
    free = max(0, max_rows - len(decodes))
    for k, d in enumerate(decodes):
        free -= take(d, free // (len(decodes) - k))


class SlotSteps:
    """The next call of every pool slot's request, on ``device`` (module docstring); ``slots``: the pool's
    slots, ``block``: the model's block size, ``graph``: the engine's draft graph (None: vanilla).
    ``compile_step``: each kind's batched bookkeeping through ``torch.compile`` (``CompiledStep``; True:
    Inductor, or a backend's name), on the padded shapes of ``_group_replayed`` (launched too, as with
    ``replay="eager"``), which bound the compiles to one a kind and request bucket; None (default): on
    CUDA."""

    def __init__(self, slots: int, block: int, device: torch.device, graph=None, replay: str | None = None,
                 compile_step: bool | str | None = None):
        if replay not in (None, "cuda", "eager"):
            raise ValueError(f"replay: expected None, 'cuda' or 'eager', got {replay!r}")
        self.block, self.device, self.replay = block, device, replay
        self.compile_step = device.type == "cuda" if compile_step is None else compile_step
        self.tables = None if graph is None or not len(graph) else DraftTables.from_graph(graph, device)
        self.spare = slots  # one slot more than the pool's: a replayed step's padding requests step it
        self.rows = torch.zeros(slots + 1, 1, block, dtype=torch.long, device=device)
        self.parents = torch.full((slots + 1, 1), -1, dtype=torch.long, device=device)
        self.n_rows = torch.ones(slots + 1, dtype=torch.long, device=device)
        self.info = torch.zeros(slots + 1, 2, dtype=torch.long, device=device)
        self.counts: list[int] = []                    # host: real rows of each slot's next call
        self.next_parents: list[list[int]] = []        # host: their parents
        self.host_rows: list[Tensor] = []              # host: the rows
        # host: each next call's drafts' turns in the pruning and parent bit sets, int64 [N - 1, 2]
        # (``keep_drafts``; None: the call was written, not built)
        self.orders: list[Tensor | None] = []
        self._opened: dict[int, tuple[int, int]] = {}  # slot -> (request, block) its buffers hold
        self.reset()
        self._steps: dict[StepRules, object] = {}
        self._graphs: dict[tuple, _StepGraph] = {}  # (rules, padded requests, padded rows, dtype) -> graph
        self._pool = None
        self.captures = self.replays = self.cuts = 0  # cuts: next calls keep_drafts cut

    @classmethod
    def for_engine(cls, slots: int, block: int, device: torch.device, graph, graphs,
                   compile_step: bool | str | None = None) -> "SlotSteps":
        """An engine's ``SlotSteps``: its own (``graphs`` None), or the one kept with its ``BatchGraphs``
        for this draft graph and ``compile_step``, with a slot for each of their pool's and the step graphs
        it captured, which the next engine sharing those graphs takes over (``reset``)."""
        if graphs is None:
            return cls(slots, block, device, graph, compile_step=compile_step)
        kept = graphs.slot_steps
        key = (graph, block, device, compile_step)
        if key not in kept:
            kept[key] = cls(graphs.pool.max_requests, block, device, graph, graphs.replay, compile_step)
        kept[key].reset()
        return kept[key]

    @property
    def compile_error(self) -> str | None:
        """Why a kind's compiled bookkeeping fell back to the eager ops (None: none did)."""
        return next((s.compile_error for s in self._steps.values() if s.compile_error), None)

    def reset(self) -> None:
        """No slot holds a request (a new engine's): each slot's next block is loaded afresh."""
        slots = self.spare
        self.counts = [1] * slots
        self.next_parents = [[-1] for _ in range(slots)]
        self.host_rows = [torch.zeros(1, self.block, dtype=torch.long) for _ in range(slots)]
        self.orders = [None] * slots
        self._opened = {}

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
        self._graphs.clear()  # they step the old buffers

    def load(self, decodes) -> None:
        """Put the block each decode opened since its last step into its slot: the block's state as its
        one real row, its [start, need]."""
        fresh = [d for d in decodes if self._opened.get(d.slot) != (d.request_id, d.blocks)]
        if not fresh:
            return
        self.write_calls([d.slot for d in fresh], [d.state[None] for d in fresh], [[-1]] * len(fresh),
                         [(d.start, d.need) for d in fresh], room=max(1 + step_rules(d).draft_budget for d in fresh))
        for d in fresh:
            self._opened[d.slot] = (d.request_id, d.blocks)

    def write_calls(self, slots: list[int], rows: list[Tensor], parents: list[list[int]],
                    info: list[tuple[int, int]] | None = None, room: int = 1) -> None:
        """Make each slot's next call ``rows[i]`` (int64 ``[N_i, B]``, host) with ``parents[i]`` (and its
        block's [start, need] ``info[i]`` if given), in one host-to-device copy: the rows past the real
        ones copies of row 0 with parent 0; the buffers at least ``room`` rows a slot."""
        width = max([self.rows.shape[1], room] + [int(r.shape[0]) for r in rows])
        self._room(width)
        b, f, extra = self.block, len(slots), 0 if info is None else 2
        host = torch.zeros(f, width * b + width + 1 + extra, dtype=torch.long)
        for i, (r, p) in enumerate(zip(rows, parents)):
            n = int(r.shape[0])
            host[i, :width * b] = torch.cat([r, r[:1].expand(width - n, b)]).flatten()
            host[i, width * b:width * b + n] = torch.tensor(p)
            host[i, width * b + width] = n
        if info is not None:
            host[:, -2:] = torch.tensor(info)
        parts = host.to(self.device).split([width * b, width, 1, extra], dim=1)
        at = torch.tensor(slots, device=self.device)
        self.rows[at] = parts[0].reshape(f, width, b)
        self.parents[at] = parts[1]
        self.n_rows[at] = parts[2][:, 0]
        if info is not None:
            self.info[at] = parts[3]
        for slot, r, p in zip(slots, rows, parents):
            self.counts[slot], self.next_parents[slot], self.host_rows[slot] = int(r.shape[0]), list(p), r.clone()
            self.orders[slot] = None

    def keep_drafts(self, decodes, max_rows: int) -> None:
        """``Engine(max_verify_rows=max_rows)``: cut each decode's next call to its share of the rows
        (``share_drafts``, as the host loop shares them), that is to the drafts ``graph.build_drafts``
        keeps with that budget (``prefix_of_drafts``, from the pruning's order the step read back), in
        one host-to-device copy."""
        budgets: list[int] = []

        def take(d, share: int) -> int:
            budgets.append(min(share, self.counts[d.slot] - 1))
            return budgets[-1]
        share_drafts(decodes, max_rows, take)
        slots, rows, parents = [], [], []
        for d, budget in zip(decodes, budgets):
            if self.counts[d.slot] - 1 <= budget:
                continue
            if self.orders[d.slot] is None:
                raise RuntimeError(f"keep_drafts: slot {d.slot}'s next call was written, not built: no order")
            order = self.orders[d.slot]
            keep, kept_parents = prefix_of_drafts(order[:, 1].tolist(), order[:, 0].tolist(), budget)
            slots.append(d.slot)
            rows.append(self.host_rows[d.slot][[0] + [j + 1 for j in keep]])
            parents.append([-1] + kept_parents)
        if slots:
            self.write_calls(slots, rows, parents)
            self.cuts += len(slots)

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

    def settle(self, decodes, positions: list[Tensor], conf: Tensor, tok: Tensor, also: Tensor | None = None):
        """The bookkeeping of the call ``forward_rows`` gave, on its confidences ``conf``/``tok`` at
        ``positions`` (``logit_positions``; flat, on the device): each decode's next call in its slot;
        returns, per decode, its status word (``STATUS_FIELDS`` then the call's real parents) and its new
        main state (int64 ``[B]``, host), after one read back; the next calls' layout is kept in
        ``counts``, ``next_parents`` and ``host_rows``. ``also``: a device tensor read back in the same
        wait, returned second (its host copy)."""
        b = self.block
        counts = [self.counts[d.slot] for d in decodes]
        bounds = torch.tensor(row_bounds(counts)[:-1])
        flat = torch.cat([p + int(at) * b for p, at in zip(positions, bounds)])
        groups: dict[StepRules, list[int]] = {}
        for i, d in enumerate(decodes):
            groups.setdefault(step_rules(d), []).append(i)
        reads, widths = [], []
        for rules, members in groups.items():
            n = 1 + rules.draft_budget
            at = torch.tensor(members)
            # each request's rows, the padding rows taking its last real row's confidences (never read)
            src = bounds[at][:, None] + torch.minimum(torch.arange(n)[None], torch.tensor(counts)[at][:, None] - 1)
            slots = torch.tensor([decodes[i].slot for i in members])
            run = self._group if self.replay is None and not self.compile_step else self._group_replayed
            reads.append(run(rules, conf, tok, flat, src.flatten(), slots, sum(counts)))
            widths.append((members, _STATUS + n, n))
        host = torch.cat([r.flatten() for r in reads])
        if also is not None:  # two copies, one wait
            host, also = host.to("cpu", non_blocking=True), also.to("cpu", non_blocking=True)
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
        host = host.cpu()  # the step's one read back
        results: list = [None] * len(decodes)
        at = 0
        for (members, s, k), read in zip(widths, reads):
            part = host[at:at + read.numel()].view(read.shape)
            at += read.numel()
            for i, row in zip(members, part):
                n_next = int(row[s + k])
                status = row[:s].tolist()
                parents = row[s:s + n_next].tolist()
                next_rows = row[s + k + 1:s + k + 1 + k * b].view(k, b)[:n_next].clone()
                order = row[s + k + 1 + k * b:].view(k, 2)[1:n_next]
                results[i] = (status[:_STATUS] + status[_STATUS:_STATUS + status[3]], next_rows[0])
                slot = decodes[i].slot
                self.counts[slot], self.next_parents[slot], self.host_rows[slot] = n_next, parents, next_rows
                self.orders[slot] = order  # read only when keep_drafts cuts the call
        return results if also is None else (results, also)

    def settle_folded(self, decodes, positions: list[Tensor], forward):
        """``settle`` after a folded forward it does not wait for: ``forward(read_folds, first_level)``
        (``BatchGraphs.verify``) replays it, the bookkeeping runs on its confidences, and its fold masks
        and overflow flag come back with the step's results in one read. If a gate overflowed (more
        positions to compute than its graph packs), the calls in flight are put back, the forward is
        replayed from the next capacity level and the step runs again. Returns ``settle``'s results, each
        decode's fold masks and the forwards that overflowed."""
        slots = [d.slot for d in decodes]
        flight = [(self.host_rows[s], self.next_parents[s], self.orders[s]) for s in slots]
        res = forward(False, 0)
        results, folds = self.settle(decodes, positions, res.conf, res.tok, also=res.folds)
        masks, overflow = split_folds(folds, [int(r.shape[0]) for r, _, _ in flight])
        if not overflow or res.final:
            return results, masks, 0
        self.write_calls(slots, [r for r, _, _ in flight], [p for _, p, _ in flight])
        for s, (_, _, order) in zip(slots, flight):
            self.orders[s] = order
        res = forward(True, 1)
        return self.settle(decodes, positions, res.conf, res.tok), res.masks, 1 + res.overflows

    def _group(self, rules: StepRules, conf: Tensor, tok: Tensor, flat: Tensor, src: Tensor, slots: Tensor,
               total_rows: int) -> Tensor:
        """One kind of decode's bookkeeping (``slots``' requests, ``src``: the rows of the step each of
        their padded ``N`` rows reads, ``flat``: where the confidences of the step's ``total_rows`` rows
        lie); its requests' next calls written into their slots; returns what the host reads of each: the
        status word, the next call's parents, its real rows, its rows and their order (``draft_rows``'
        ``order``, for ``keep_drafts``; int64 ``[g, ...]``). Tensor ops
        alone, on the given tensors' shapes: what a replayed step captures."""
        b, n, g = self.block, 1 + rules.draft_budget, slots.shape[0]
        dev = self.device
        flat, src, slots = flat.to(dev), src.to(dev), slots.to(dev)
        # the unmasked positions as the host loop leaves them: confidence 0, the mask token
        full_conf, full_tok = spread_confidences(conf, tok, flat, total_rows * b, rules.mask_id)
        shaped = (g, n, b)
        conf_rows = full_conf.view(-1, b).index_select(0, src).view(shaped)
        tok_rows = full_tok.view(-1, b).index_select(0, src).view(shaped)
        next_rows, next_parents, next_n, status, order = self._step(rules)(
            conf_rows, tok_rows, self.rows[slots, :n], self.parents[slots, :n], self.n_rows[slots], self.info[slots])
        self.rows[slots, :n] = next_rows
        self.parents[slots, :n] = next_parents
        self.n_rows[slots] = next_n
        return torch.cat([status, next_parents, next_n[:, None], next_rows.flatten(1), order.flatten(1)], 1)

    def _group_replayed(self, rules: StepRules, conf: Tensor, tok: Tensor, flat: Tensor, src: Tensor, slots: Tensor,
                        total_rows: int) -> Tensor:
        """``_group`` replayed from a graph of padded shapes (``replay``: "cuda", a CUDA graph captured the
        first time; "eager", the same buffers with ``_group`` called again): requests padded to a power of
        two (the padding ones step the spare slot), rows and positions to ``row_bucket``'s sizes (the
        padding positions land in a row past the real ones). Per step: the confidences copied into the
        graph's buffers, one copy of the index inputs, the replay."""
        b, n, g = self.block, 1 + rules.draft_budget, int(slots.shape[0])
        g_pad, r_pad = request_bucket(g), row_bucket(total_rows)
        m_pad = r_pad * b
        key = (rules, g_pad, r_pad, conf.dtype)
        graph = self._graphs.get(key)
        fresh = graph is None
        if fresh:
            dev = self.device
            graph = self._graphs[key] = _StepGraph(torch.zeros(m_pad, dtype=conf.dtype, device=dev),
                                                   torch.zeros(m_pad, dtype=torch.long, device=dev),
                                                   torch.zeros(m_pad + g_pad * n + g_pad, dtype=torch.long, device=dev))
        m = int(flat.numel())
        graph.conf[:m].copy_(conf)
        graph.tok[:m].copy_(tok)
        graph.index.copy_(torch.cat([flat, torch.full((m_pad - m,), m_pad), src,
                                     torch.zeros((g_pad - g) * n, dtype=torch.long), slots,
                                     torch.full((g_pad - g,), self.spare)]))
        if fresh:
            self._capture(rules, graph, g_pad, r_pad)
        else:
            graph.replay()
            self.replays += 1
        return graph.out[:g]

    def _capture(self, rules: StepRules, graph: "_StepGraph", g_pad: int, r_pad: int) -> None:
        """A step graph's first use, which steps its requests once: ``_group`` run on its buffers ("eager"),
        or run once to warm up (the slots' buffers put back after it), captured, and replayed once."""
        n, m_pad = 1 + rules.draft_budget, r_pad * self.block
        index = graph.index

        def call():  # r_pad + 1 rows: the padding positions' row past the real ones
            return self._group(rules, graph.conf, graph.tok, index[:m_pad], index[m_pad:m_pad + g_pad * n],
                               index[m_pad + g_pad * n:], r_pad + 1)

        self.captures += 1
        if self._pool is None and self.replay == "cuda":
            self._pool = torch.cuda.graph_pool_handle()
        graph.out, graph.replay = record_call(call, self.device, self.replay or "eager", self._pool,
                                              (self.rows, self.parents, self.n_rows))

    def _step(self, rules: StepRules):
        """The batched bookkeeping of one kind of decode (kept: one ``torch.vmap`` a kind, compiled with
        ``compile_step``)."""
        step = self._steps.get(rules)
        if step is None:
            tables = self.tables if rules.draft_budget else None

            def one(conf, tok, rows, parents, n_rows, info):
                return step_from_confidences(conf, tok, rows, parents, n_rows, info, rules, tables, order=True)

            step = self._steps[rules] = CompiledStep(torch.vmap(one), self.compile_step)
        return step


@dataclass
class _StepGraph:
    """One replayed step's buffers: the confidences and tokens of the step's wanted positions, the index
    inputs (positions, source rows, slots) and what the host reads."""

    conf: Tensor
    tok: Tensor
    index: Tensor
    out: Tensor | None = None
    replay: object = None


def _ranks(counts: list[int]) -> Tensor:
    """0, 1, ..., c - 1 for each count c, concatenated."""
    total = sum(counts)
    starts = torch.repeat_interleave(torch.tensor(row_bounds(counts)[:-1]), torch.tensor(counts))
    return torch.arange(total) - starts
