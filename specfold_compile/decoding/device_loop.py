"""The decode loop with each step's bookkeeping on the device: ``generate(..., loop="device")``.

Per step: one verification forward of a fixed number of rows (1, or 1 + draft_budget with padding rows,
copies of the main state) and ``device_step.decode_step``, which leaves the next call's rows, parents and
a status word in one int64 buffer on the device (``StepBuffers``). What the host reads back:

- per step, the status word (``device_step.STATUS_FIELDS`` and the call's parents: 6 + draft_budget
  int64), to know whether the block is finished, how wide the next call's logits are, and for
  ``GenerateResult.steps``; with
  ``steps_per_read=k`` the host launches k steps, then reads their k words in one copy. A step launched
  after its block's last one changes nothing (``gated_step``) and reports 0 rows, but costs its forward's
  device time, which on the shipped model outweighed the waits saved (docs/benchmarks.md);
- per block, the seed token (the prefill's or the last block write's next-token argmax, as the Python
  loop reads it) and, at the block's end, its B tokens (output, eos, the block write).

With a ``VerifyGraphs`` (``cuda_graphs``) each step, the forward and its bookkeeping, is one CUDA graph
(one per row count, logit width and attention window, captured on first use, kept with the
``VerifyGraphs`` across prompts); the prefill and block writes replay as in the Python loop. Without one,
the same tensor code runs eagerly (the CPU path). On CUDA the bookkeeping after the confidences is
compiled (``DeviceDecoder``'s ``compile_step``).

The forward computes the logits of the main state's masked positions and position 0 only, as the Python
loop asks for the masked positions' (a draft's masked positions are among its main state's): the same
positions in every row, their count padded to a power of two (``logit_width``), so that a step's shapes
stay static and a few graphs cover a block (the host knows the count from the last status word, and it
only falls within a block). The other positions get conf 0 and the mask token, which nothing reads.
``all_logits=True`` computes every position's (a model whose forward takes no ``logit_positions``).

The Python loop (``decoder._decode``) is the reference: same tokens, same forwards (tests/decoding/
test_device_step_loop.py).
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch

from ..models.checks import loop_built_rows
from . import boundaries
from .commit import block_finished, confidence, spread_confidences
from .cuda_graphs import VerifyGraphs
from .device_step import STATUS_FIELDS, CompiledStep, DraftTables, StepRules, step_from_confidences
from .dynamic import mark_dynamic_shapes
from .graph import DraftGraph
from .prompt_layout import layout_prompt
from .result import GenerateResult, StepStats, model_consts

__all__ = ["StepBuffers", "DeviceDecoder", "decode_on_device", "taking_logit_positions", "check_logit_rows"]

_STATUS = len(STATUS_FIELDS)
_ROWS = STATUS_FIELDS.index("rows")
MIN_LOGIT_WIDTH = 4


def logit_width(masked: int, block: int) -> int:
    """How many positions of each row a step computes logits at, for a main state with ``masked`` masked
    positions: those and position 0, padded to the next power of two (at least ``MIN_LOGIT_WIDTH``, at
    most ``block``): log2(block / MIN_LOGIT_WIDTH) + 1 graphs per row count instead of one per count."""
    if not 0 <= masked <= block:
        raise ValueError(f"masked: expected 0 <= masked <= block = {block}, got {masked}")
    return min(block, max(MIN_LOGIT_WIDTH, 1 << masked.bit_length()))


def logit_positions(rows: torch.Tensor, width: int, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions a step of ``rows`` [N, B] computes logits at: ``sel`` [width], row 0's masked positions
    and position 0 first (ascending), then others as padding (their logits are computed, never read); and
    the flat positions ``n * B + sel`` [N * width] to ask the model for. Tensor ops only (no host read)."""
    n, block = rows.shape
    pos = torch.arange(block, device=rows.device)
    wanted = (rows[0] == mask_id) | (pos == 0)
    sel = torch.argsort((~wanted).to(torch.int32), stable=True)[:width]
    return sel, (torch.arange(n, device=rows.device)[:, None] * block + sel[None]).flatten()


@contextlib.contextmanager
def taking_logit_positions():
    """Around a forward called with ``logit_positions`` (both loops): its ``TypeError`` about that argument
    becomes ``generate``'s one-line error naming ``all_logits``; any other error passes unchanged."""
    try:
        yield
    except TypeError as exc:
        if "logit_positions" not in str(exc):
            raise
        raise TypeError(f"model: its forward takes no logit_positions ({exc}); pass generate(..., all_logits=True) "
                        "to call model(tokens, parents, cache)") from exc


def check_logit_rows(logits: torch.Tensor, positions: torch.Tensor) -> None:
    """A forward given ``logit_positions`` [M] must return logits [M, V] (both loops; shapes only, no host
    read): one that ignores the argument gets ``generate``'s one-line error naming ``all_logits``."""
    if logits.dim() != 2 or logits.shape[0] != positions.shape[0]:
        raise ValueError(f"model: expected logits [M={positions.shape[0]}, V] for logit_positions, got "
                         f"{tuple(logits.shape)}; a model that ignores logit_positions needs generate(..., "
                         "all_logits=True)")


class StepBuffers:
    """The loop's device state in one int64 buffer (one copy undoes a capture's warm-up run): the next
    call's ``rows`` [R, B] (row 0 the main state), ``parents`` [R], real rows ``n_rows`` [1], the block's
    ``info`` [start, need], the last step's ``status`` [len(STATUS_FIELDS) + R], and ``outcomes``
    [steps_per_read, len(STATUS_FIELDS) + R]: the status words of the steps launched since the host last
    read, the next one written at ``cursor`` [1] (a step launched after its block's last writes zeros)."""

    def __init__(self, rows: int, block: int, device: torch.device, steps_per_read: int = 1):
        self.rows_n, self.block = rows, block
        sizes = (rows * block, rows, 1, 2, _STATUS + rows, steps_per_read * (_STATUS + rows), 1)
        padded = [-(-size // 8) * 8 for size in sizes]  # each part 64-byte aligned, as a compiled graph wants
        self.flat = torch.zeros(sum(padded), dtype=torch.long, device=device)
        parts = [part[:size] for part, size in zip(self.flat.split(padded), sizes)]
        self.rows = parts[0].view(rows, block)
        self.parents, self.n_rows, self.info, self.status, outcomes, self.cursor = parts[1:]
        self.outcomes = outcomes.view(steps_per_read, _STATUS + rows)
        # load_block's staging buffer: pinned on CUDA, so its copy is queued without a host wait (the
        # previous one has finished by then: the host read a step's status word after it); written through
        # numpy views, a microsecond an assignment where a torch op on the host costs several
        self._host = torch.zeros(self.flat.shape, dtype=torch.long, pin_memory=device.type == "cuda")
        self._host_np = self._host.numpy()
        starts = np.cumsum([0] + padded[:-1])
        host_rows, self._host_parents, self._host_n_rows, self._host_info = (
            self._host_np[at:at + size] for at, size in zip(starts[:4], sizes))
        self._host_rows = host_rows.reshape(rows, block)

    def load_block(self, state: torch.Tensor, start: int, need: int) -> None:
        """A block's first state [B] (a CPU tensor): every row that state, parents [-1, 0, ...], one real
        row, the status word cleared; one host-to-device copy."""
        self._host_np.fill(0)
        self._host_rows[:] = state.numpy()
        self._host_parents[0] = -1
        self._host_n_rows[0] = 1
        self._host_info[:] = start, need
        self.flat.copy_(self._host, non_blocking=True)


def gated_step(conf: torch.Tensor, tok: torch.Tensor, rows: torch.Tensor, parents: torch.Tensor, n_rows: torch.Tensor,
               info: torch.Tensor, kept_rows: torch.Tensor, kept_parents: torch.Tensor, kept_status: torch.Tensor,
               rules: StepRules, tables: DraftTables | None) -> tuple[torch.Tensor, ...]:
    """``step_from_confidences`` as the buffers' new values: rows [R, B], parents [R], real rows [1] and
    status [len(STATUS_FIELDS) + R] (``kept_*``: the buffers' values before the step), and whether the step
    ran (bool []): a step launched after its block's last one (``kept_status`` says finished) changes
    nothing, so the host may launch several steps before it reads one."""
    next_rows, next_parents, next_n, status = step_from_confidences(conf, tok, rows, parents, n_rows, info, rules,
                                                                    tables)
    ran = kept_status[0] == 0
    word = torch.cat([status, kept_status[status.shape[0]:]])  # a smaller call keeps the tail
    return (torch.where(ran, next_rows.expand_as(kept_rows), kept_rows),
            torch.where(ran, next_parents.expand_as(kept_parents), kept_parents),
            torch.where(ran, next_n.reshape(1), n_rows.reshape(1)), torch.where(ran, word, kept_status), ran)


class DeviceDecoder:
    """Runs the steps of one kind of decode (``StepRules``, draft graph) on ``model``: eagerly, or as CUDA
    graph replays on the static cache of ``graphs`` (its ``replay="eager"`` runs the same bookkeeping
    with the model called again). ``for_graphs`` keeps one per ``VerifyGraphs`` and decode kind.

    ``compile_step`` (None: on CUDA): the bookkeeping after the confidences (``gated_step``, a few
    hundred small ops) through ``torch.compile``, which fuses them into a few dozen kernels; the
    confidences stay eager (the Python loop's function). A compile that fails falls back to the eager
    ops, the reason kept in ``compile_error``. ``steps_per_read``: steps ``steps`` launches before it
    reads their status words (``decode_on_device``'s)."""

    def __init__(self, model, rules: StepRules, graph: DraftGraph | None, device: torch.device,
                 graphs: VerifyGraphs | None = None, compile_step: bool | None = None,
                 trace=None, steps_per_read: int = 1, all_logits: bool = False):
        self.model, self.rules, self.graphs, self.trace = model, rules, graphs, trace
        self.all_logits = all_logits
        compile_step = device.type == "cuda" if compile_step is None else compile_step
        self._compiled_step = CompiledStep(gated_step, compile_step)
        self.tables = None if graph is None or rules.draft_budget == 0 else DraftTables.from_graph(graph, device)
        self.steps_per_read = steps_per_read
        self.buffers = StepBuffers(1 + rules.draft_budget, rules.block_size, device, steps_per_read)
        # (rows, logit width, window) -> replay, on the static cache below; "first": first_step's bookkeeping
        self.captured: dict[tuple | str, object] = {}
        self.cache = None
        self.captures = self.replays = 0

    @classmethod
    def for_graphs(cls, model, rules: StepRules, graph: DraftGraph | None, device: torch.device,
                   graphs: VerifyGraphs | None, compile_step: bool | None = None,
                   trace=None, steps_per_read: int = 1, all_logits: bool = False) -> "DeviceDecoder":
        if graphs is None:
            return cls(model, rules, graph, device, compile_step=compile_step, trace=trace,
                       steps_per_read=steps_per_read, all_logits=all_logits)
        kept = graphs.device_decoders
        key = (rules, graph, device, compile_step, id(trace), steps_per_read, all_logits)
        if key not in kept:
            kept[key] = cls(model, rules, graph, device, graphs, compile_step, trace, steps_per_read, all_logits)
        return kept[key]

    @property
    def compile_error(self) -> str | None:
        return self._compiled_step.compile_error

    def _bookkeeping(self, *args):
        return self._compiled_step(*args)

    def width(self, masked: int) -> int:
        """The logit width of a step whose main state has ``masked`` masked positions (``logit_width``;
        every position with ``all_logits``)."""
        block = self.rules.block_size
        return block if self.all_logits else logit_width(masked, block)

    def _run(self, n: int, width: int, cache) -> torch.Tensor:
        """One call of ``n`` rows, logits at ``width`` positions a row, and its bookkeeping; the buffers
        updated in place."""
        buf = self.buffers
        rows, parents = buf.rows[:n], buf.parents[:n]
        positions = None
        if not self.all_logits:  # at every width, a full one too: one compiled graph for all of them
            _, positions = logit_positions(rows, width, self.rules.mask_id)
        mark_dynamic_shapes(rows, parents, cache, positions)
        if self.trace is not None:
            self.trace.before()
        with loop_built_rows():  # valid by construction: no data check, no read-back
            if positions is None:
                logits = self.model(rows, parents, cache)
            else:
                with taking_logit_positions():
                    logits = self.model(rows, parents, cache, logit_positions=positions)
                check_logit_rows(logits, positions)
        return self._settle(logits, n, positions)

    def first_step(self, logits: torch.Tensor) -> list[int]:
        """The block's first step (N = 1, the state ``load_block`` put in the buffers) on the logits [B, V]
        of the pass that wrote the prefix before it (``fuse_boundaries``): its bookkeeping only, replayed
        from a CUDA graph of its own with ``graphs`` (the logits copied into the graph's input), else run
        at once; returns the status word as ``step`` does."""
        if self.graphs is None:
            return self._settle_first(logits)[:_STATUS + 1].tolist()
        self._replay_first(logits)
        return self.buffers.status[:_STATUS + 1].tolist()

    def _replay_first(self, logits: torch.Tensor) -> None:
        """``first_step``'s graph (captured on first use) on ``logits``: device work only, no read."""
        replay = self.captured.get("first")
        if replay is None:
            self._first_logits = logits.clone()  # the graph's input buffer
            forced_index = getattr(self.trace, "index", None)
            restore = (self.buffers.flat,) + ((forced_index,) if forced_index is not None else ())
            _, replay = self.graphs._record(lambda: self._settle_first(self._first_logits), logits.device,
                                            restore=restore)
            self.captured["first"] = replay
            self.captures += 1
        else:
            self._first_logits.copy_(logits)
            replay()
            self.replays += 1

    def _settle_first(self, logits: torch.Tensor) -> torch.Tensor:
        if self.trace is not None:
            self.trace.before()
        return self._settle(logits[None], 1)

    def _settle(self, logits: torch.Tensor, n: int, positions: torch.Tensor | None = None) -> torch.Tensor:
        """A call's bookkeeping on its logits [n, B, V], or [n * W, V] at the flat ``positions`` [n * W]
        (``logit_positions``): the next call's rows, parents and the status in the buffers, the status
        word also in ``outcomes`` (zeros for a step that did not run)."""
        buf = self.buffers
        rows, parents = buf.rows[:n], buf.parents[:n]
        rules = self.rules
        conf, tok = confidence(logits, rules.mask_id, rules.confidence_dtype, rules.argmax_of_probs)
        if positions is not None:  # every row's other positions: conf 0 and the mask token, as the Python loop's
            conf, tok = (t.view(n, -1) for t in spread_confidences(conf, tok, positions, n * rules.block_size,
                                                                   rules.mask_id))
        *new, ran = self._bookkeeping(conf, tok, rows, parents, buf.n_rows[0], buf.info, buf.rows, buf.parents,
                                      buf.status, rules, self.tables)
        for kept, value in zip((buf.rows, buf.parents, buf.n_rows, buf.status), new):
            kept.copy_(value)
        if self.trace is not None:
            self.trace.after(buf, ran)
        at = buf.cursor.clamp(max=self.steps_per_read - 1)
        buf.outcomes.index_copy_(0, at, torch.where(ran, buf.status, 0)[None])
        buf.cursor.add_(1)
        return buf.status

    def steps(self, n: int, cache, masked: int) -> list[list[int]]:
        """``steps_per_read`` steps on ``cache``, the first of ``n`` rows (1 or 1 + draft_budget), the
        others of 1 + draft_budget, launched one after the other, each with the logit width of ``masked``
        masked positions (the main state's before the first: a block's count only falls); then their
        status words, read back to the host at once: ``STATUS_FIELDS`` then the call's parents, a word of
        zeros (0 rows) for a step launched after its block's last one."""
        if self.steps_per_read > 1:  # one step a read always writes row 0 (the clamp): no launch needed
            self.buffers.cursor.zero_()
        width = self.width(masked)
        for j in range(self.steps_per_read):
            m = n if j == 0 else self.buffers.rows_n
            if self.graphs is None:
                self._run(m, width, cache)
            else:
                self._replay(m, width, cache)
        return [word[:_STATUS + word[_ROWS]] for word in self.buffers.outcomes.tolist()]

    def _replay(self, n: int, width: int, cache) -> torch.Tensor:
        graphs = self.graphs
        if cache is not graphs.cache:
            raise ValueError("cache: expected the static cache returned by VerifyGraphs.attach")
        if cache is not self.cache:  # new buffers (``attach`` outgrew the old ones): the graphs read the old
            self.captured.clear()
            self.cache = cache
        window, view = graphs.window(max(cache.length, 1))
        key = (n, width, window)
        replay = self.captured.get(key)
        if replay is None:
            rows, parents = self.buffers.rows[:n], self.buffers.parents[:n]
            mark_dynamic_shapes(rows, parents, view)
            forced_index = getattr(self.trace, "index", None)  # a StepForcing's position in its record
            restore = (self.buffers.flat,) + ((forced_index,) if forced_index is not None else ())
            _, replay = graphs._record(lambda: self._run(n, width, view), rows.device, restore=restore)
            self.captured[key] = replay
            self.captures += 1
        else:
            replay()
            self.replays += 1
        return self.buffers.status


def decode_on_device(model, prompt_ids, mode, max_new_tokens, threshold, draft_budget, graph, stop_at_eos,
                     compile_writes=False, graphs: VerifyGraphs | None = None,
                     confidence_dtype: str = "model", compile_step: bool | None = None,
                     forward=None, trace=None, fuse_boundaries: bool | str = False,
                     steps_per_read: int = 1, all_logits: bool = False) -> GenerateResult:
    """``decoder._decode``'s loop with ``DeviceDecoder`` steps (arguments validated by ``generate``;
    ``compile_step``: ``DeviceDecoder``'s; ``forward``: the verification call, None: ``model`` itself).
    ``trace``: a ``step_forcing.StepRecorder`` (records every step's outcome and every seed) or
    ``StepForcing`` (replays a record), for trace-driven benchmarks. ``fuse_boundaries``: as in
    ``generate``; the guess of a seed is the last step's status word's ``seed_guess``, and a fused
    block's first step runs only its bookkeeping (``DeviceDecoder.first_step``). ``steps_per_read`` and
    ``all_logits``: as in ``generate``."""
    B, sb, mask_id, eos_id = model_consts(model)
    fam = model.config.decoding_rules
    layout = layout_prompt(prompt_ids, B, fam.prompt_on_block_grid)
    layout.check_positions(max_new_tokens, int(model.config.max_position_embeddings))  # before any forward
    eos = eos_id if stop_at_eos else None
    spiffy = mode != "vanilla" and draft_budget > 0 and graph is not None and len(graph) > 0
    rules = StepRules(B, sb, mask_id, eos, threshold, fam.threshold_inclusive, confidence_dtype,
                      fam.argmax_of_probs, draft_budget if spiffy else 0)
    device = prompt_ids.device
    decoder = DeviceDecoder.for_graphs(model if forward is None else forward, rules, graph if spiffy else None, device,
                                       graphs, compile_step, trace, steps_per_read, all_logits)
    captures0, replays0 = decoder.captures, decoder.replays
    writes = {"compiled": True} if compile_writes else {}
    guessing = bool(fuse_boundaries) and bool(model.config.shift_logits)
    t0 = time.perf_counter()
    # verified: (state, logits [B, V]) of the next block's first state, from the pass before it
    cache, verified = boundaries.prefill(model, layout, writes, boundaries.fuses_prefill(fuse_boundaries), B,
                                         mask_id, device, graphs,
                                         layout.last_block_start(max_new_tokens) + (B if fuse_boundaries else 0))
    nfe = 1 if layout.prefill_ids.numel() else 0
    out: list[int] = []
    steps: list[StepStats] = []
    nblocks, head = 0, layout.head
    while True:
        nblocks += 1
        start = len(head)
        need = min(B - start, max_new_tokens - len(out))
        x = boundaries.first_state(head, cache, B, mask_id)  # the seed read on the host as the Python loop does
        if not head and trace is not None:
            x[0] = trace.seed(int(x[0]))
        head = []
        verified = boundaries.confirmed(verified, x)
        guess = None
        written = x  # a block finished at its first state is written from the host
        if not block_finished(x, mask_id, need, eos, start):
            decoder.buffers.load_block(x, start, need)
            n, done, masked = 1, False, int((x == mask_id).sum())
            while not done:
                fused = verified is not None
                if fused:
                    words = [decoder.first_step(verified[1])]
                    verified = None
                else:
                    words = decoder.steps(n, cache, masked)
                for word in words:
                    done, accepted, stalled, rows, guess, masked = word[:_STATUS]
                    if rows == 0:  # launched after the block's last step: it changed nothing
                        break
                    nfe += not fused
                    steps.append(StepStats(branches=rows, accepted=accepted, parents=word[_STATUS:], fused=fused))
                    if stalled:
                        raise RuntimeError("decoding made no progress (non-finite logits?)")
                    if done:
                        break
                n = 1 + rules.draft_budget
            written = decoder.buffers.rows[0]  # the block's tokens: written from the device, read for the output
            x = written.cpu()
        blk = x[start:start + need].tolist()
        stop = eos is not None and eos in blk
        if stop:
            blk = blk[: blk.index(eos) + 1]
        out.extend(blk)
        if stop or len(out) >= max_new_tokens:
            break
        nxt = None
        if guessing:
            nxt = boundaries.seed_guess(model, guess is not None, mask_id if guess is None else guess, mask_id,
                                        min(B, max_new_tokens - len(out)), eos, B)
        cache, verified = boundaries.write(model, cache, written, graphs, compile_writes, nxt, device)
        nfe += 1
    result = GenerateResult(tokens=out, nfe=nfe, wall_time_s=time.perf_counter() - t0, steps=steps, mode=mode,
                            blocks=nblocks)
    result.graph_captures, result.graph_replays = decoder.captures - captures0, decoder.replays - replays0
    return result
