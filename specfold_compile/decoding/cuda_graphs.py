"""CUDA graphs in the decode loop: each verification shape is captured once and replayed.

Why: launched from the host, a verification call is host-bound on the H200's host (measured at the 1.5B
and 7B shapes: 10-29 ms a call dense under Inductor, 34-58 ms folded, against 2-15 ms of GPU time), so a
loop that launches its calls gets neither the forward's GPU speed nor SpecFold's gain; replays get both.

What makes a call replayable is that every tensor it reads keeps its address and shape. The prefix
cache is static (``model.static_cache``: fixed capacity, its length on the device, block writes in
place), so a call's shapes depend only on the branch count N, the number M of logit rows and the
attention window (below); M is padded to a power of two (at least ``MIN_LOGIT_ROWS``, at most N * B) by
repeating the last position, whose extra logits are dropped. One graph per (N, padded M, window),
captured the first time that shape comes, right after one launched call with the same inputs, which
compiles, autotunes and warms (a SpecFold-compiled model's first launched call at an N also runs its
folded graph once, and captured calls fold: ``fold_launched``). Every graph reads the same input
buffers and the same static cache, and all share one memory pool: calls run one at a time and each
call's logits are read before the next replay.

Block writes replay too (``VerifyGraphs.write_block``, one graph per block length): on the static cache
a write is ``model.append_block_static``, which writes the block's K/V into the buffers at the device
length and attends over the whole buffers with the keys past the block masked, so its shapes do not
depend on the prefix length either.

The prompt's prefill replays too (``VerifyGraphs.prefill``, one graph per padded row count): on the
static cache it is ``model.prefill_static``, which writes the prompt's K/V into the buffers from key 0,
the prompt padded after its rows to a bucket and its length on the device, so neither the prompt's
length nor a launched pass of its own (host-bound like a launched call) reaches the loop.

Attention windows: a call does not read the whole capacity but a window of it, views of the buffers'
first W keys (same addresses), W the smallest of ``windows``, 2 x ``windows``, 4 x ... (at most the
capacity) that holds the keys the call reads. A cache allocated for a long generation then pays
attention over about the valid keys, not the capacity (the plain graph's dense attention and the block
writes' masked attention read every key they are given); one graph per window, log2(capacity /
``windows``) + 1 windows at most; the keys' length is traced as dynamic, so windows share a compiled
graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..models.protocol import StaticCacheModel, VerifyForward
from .dynamic import mark_dynamic_keys, mark_dynamic_shapes
from .graph_capture import record_call

__all__ = ["VerifyGraphs", "logit_rows_bucket", "prefill_rows_bucket", "MIN_LOGIT_ROWS", "CAPACITY_STEP", "REPLAYS"]

MIN_LOGIT_ROWS = 16
CAPACITY_STEP = 256   # static caches are allocated in multiples of this many keys, so prompts share graphs
REPLAYS = ("cuda", "eager")


def logit_rows_bucket(m: int, rows: int) -> int:
    """The padded logit row count for ``m`` rows of a call with ``rows`` = N * B positions: the next
    power of two, at least MIN_LOGIT_ROWS, at most ``rows`` (at most 2x the LM head's rows, and about
    log2(N * B) graphs per N instead of N * B)."""
    if m < 1 or m > rows:
        raise ValueError(f"m: expected 1 <= m <= rows = {rows}, got {m}")
    return min(rows, max(MIN_LOGIT_ROWS, 1 << (m - 1).bit_length()))


def prefill_rows_bucket(rows: int) -> int:
    """The padded row count of a prefill graph for ``rows`` rows (the prompt's, plus a verified next
    block's): a multiple of an eighth of the next power of two (at least 16), so prompts share graphs
    (4 per doubling of the length beyond 128) and the padding adds fewer than max(16, rows / 4) rows."""
    if rows < 1:
        raise ValueError(f"rows: expected >= 1, got {rows}")
    step = max(16, (1 << (rows - 1).bit_length()) // 8)
    return -(-rows // step) * step


@dataclass
class _Graph:
    tokens: Tensor           # [N, B] int64, the call's input buffers (a prefill: its padded rows [S])
    parents: Tensor | None   # [N] (a write: the next block's state [B] it verifies, or None; a prefill: its length [1])
    positions: Tensor | None  # [M padded] or None (every position's logits)
    logits: Tensor           # the output buffer the replay writes
    replay: object           # () -> None


class VerifyGraphs:
    """The verification calls of a decode loop as CUDA graph replays (``generate(..., cuda_graphs=...)``).

    Keep one across ``generate`` calls (one model, one process) to reuse its static cache and graphs:
    ``attach`` copies each new prompt's prefix into the same buffers when they are large enough.
    ``replay="eager"`` runs the same bookkeeping (static cache, input buffers, padded positions, one
    entry per shape) with the model called again instead of a graph replayed: for the CPU, for tests,
    and to bisect a wrong result between the bookkeeping and the capture. ``capture_writes``: ``generate``
    replays its block writes too (``write_block``); False launches them (in place, through the window).
    ``capture_prefill``: ``generate`` replays the prompt's prefill too (``prefill``, straight into the
    static cache); False launches it on a cache of its own and copies the prefix in (``attach``).
    ``windows``: the smallest attention window in keys (module docstring; windows double from it up to
    the capacity); None: every call reads the whole capacity (the bisect switch).

    ``model`` keeps the static cache and writes the blocks; ``forward``, the verification call that is
    captured, is the model itself by default, or a compiled forward of it (``generate(mode="specfold")``
    passes ``torch.compile(model, backend="specfold")`` here). A ``torch.compile``'d model passed as
    ``model`` serves as both (``models.protocol``).
    """

    def __init__(self, model: StaticCacheModel, replay: str = "cuda", capture_writes: bool = True,
                 windows: int | None = CAPACITY_STEP, forward: VerifyForward | None = None,
                 capture_prefill: bool = True):
        if replay not in REPLAYS:
            raise ValueError(f"replay: expected one of {REPLAYS}, got {replay!r}")
        for name, flag in (("capture_writes", capture_writes), ("capture_prefill", capture_prefill)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
        if windows is not None and (isinstance(windows, bool) or not isinstance(windows, int) or windows < 2):
            raise ValueError(f"windows: expected None or an int >= 2 (the smallest window in keys), "
                             f"got {windows!r}")
        if forward is not None and not callable(forward):
            raise TypeError(f"forward: expected None or a callable verification forward, got {type(forward).__name__}")
        self.model = model
        self.forward = model if forward is None else forward
        self.replay = replay
        self.capture_writes = capture_writes
        self.capture_prefill = capture_prefill
        self.windows = windows
        self.cache = None                   # the static cache the graphs read
        self._windows: dict[int, object] = {}  # window keys -> a PrefixCache of views of the cache's buffers
        self.graphs: dict[tuple[int, int | None, int], _Graph] = {}  # (N, padded M, window)
        # the device loop's steps (device_loop.DeviceDecoder.for_graphs): they live as long as the static cache
        self.device_decoders: dict[tuple, object] = {}
        self.captures = 0                   # verification calls: shapes captured, calls replayed
        self.replays = 0
        # (block length, causal, compiled, next block verified with it, window)
        self.write_graphs: dict[tuple[int, bool, bool, bool, int], _Graph] = {}
        self.write_captures = 0             # block writes (write_block)
        self.write_replays = 0
        # (padded rows, block-causal, compiled, next block's rows, window)
        self.prefill_graphs: dict[tuple[int, bool, bool, int, int], _Graph] = {}
        self.prefill_captures = 0           # prompts' prefills (prefill)
        self.prefill_replays = 0
        self._pool = None

    def attach(self, cache, needed: int):
        """The static cache holding ``cache``'s prefix (a prefill's), with room for ``needed`` keys: the
        buffers already captured on if large enough (graphs stay valid), else new buffers of ``needed``
        rounded up to CAPACITY_STEP, plus one spare key (graphs dropped)."""
        if self._reusable(cache.keys[0].device, needed):
            return self.model.static_cache(cache, out=self.cache)
        self._drop_graphs()
        capacity = -(-needed // CAPACITY_STEP) * CAPACITY_STEP
        # One spare key: every window, the largest included, is then a strided view of the buffers, so a
        # compiled model traces one set of strides for all of them (a contiguous whole buffer next to
        # strided windows would cost a second compile of every graph).
        self.cache = self.model.static_cache(cache, capacity + 1)
        return self.cache

    def _reusable(self, device: torch.device, needed: int) -> bool:
        return self.cache is not None and self.cache.keys[0].device == device and self.cache.capacity - 1 >= needed

    def _drop_graphs(self) -> None:
        self.graphs.clear()
        self.write_graphs.clear()
        self.prefill_graphs.clear()
        self._windows.clear()

    def prefill(self, prompt_ids: Tensor, needed: int, block_causal: bool = False, compiled: bool = False,
                next_block: Tensor | None = None):
        """``model.prefill`` written straight into the static cache (``attach``'s buffers, with room for
        ``needed`` keys), replayed from a CUDA graph (``capture_prefill``): one per padded row count
        (``prefill_rows_bucket``), mask, ``compiled``, window and whether ``next_block`` is verified with
        it, captured on first use; ``model.prefill_static``, the prompt padded after its rows (and the next
        block's), whose K/V are scratch past the prefix. The checks run on the host first;
        ``next_logits`` (and ``next_block_logits``) are copies out of the pool. Returns the static cache."""
        self.model.check_prompt(prompt_ids, compiled, block_causal)
        length, device = int(prompt_ids.shape[0]), prompt_ids.device
        if next_block is not None and length == 0:
            raise ValueError("next_block: an empty prompt has no prefill to verify it with")
        next_rows = 0 if next_block is None else int(next_block.shape[0])
        rows = prefill_rows_bucket(length + next_rows) if length else 0
        if length:
            self.model.check_next_block(next_block, length)
        if not self._reusable(device, max(needed, rows)):
            self.attach(self.model.empty_cache(device), max(needed, rows))
        cache = self.cache
        if length == 0:
            cache.device_length.zero_()
            cache.static_length, cache.next_logits, cache.next_block_logits = 0, None, None
            return cache
        window, view = self.window(rows)
        key = (rows, block_causal, compiled, next_rows, window)
        graph = self.prefill_graphs.get(key)
        if graph is None:
            run = self.model.compiled_method("prefill_static") if compiled else self.model.prefill_static
            ids = prompt_ids.new_zeros(rows)  # the graph's input buffers: the rows and the prompt's length
            prompt_length = prompt_ids.new_zeros(1)
            mark_dynamic_keys(view)
            if compiled:  # one compiled graph for every bucket
                torch._dynamo.maybe_mark_dynamic(ids, 0)

            def call():
                return run(view.keys, view.values, cache.device_length, ids, prompt_length, block_causal, next_rows)

            self._load_prefill(ids, prompt_length, prompt_ids, next_block)
            logits, replay = self._record(call, device)
            graph = self.prefill_graphs[key] = _Graph(ids, prompt_length, None, logits, replay)
            self.prefill_captures += 1
        else:
            self._load_prefill(graph.tokens, graph.parents, prompt_ids, next_block)
            graph.replay()
            self.prefill_replays += 1
        next_logits, block_logits = graph.logits
        cache.next_logits = next_logits.clone()
        cache.next_block_logits = None if block_logits is None else block_logits.clone()
        cache.static_length = length
        return cache

    @staticmethod
    def _load_prefill(ids: Tensor, prompt_length: Tensor, prompt_ids: Tensor, next_block: Tensor | None) -> None:
        n = prompt_ids.shape[0]
        ids[:n].copy_(prompt_ids)
        if next_block is not None:
            ids[n:n + next_block.shape[0]].copy_(next_block)
        prompt_length.fill_(n)

    def window_keys(self, needed: int) -> int:
        """The window (in keys) of a call that reads the first ``needed`` keys of the attached cache: at
        most the capacity ``attach`` was asked for (the buffers' spare key is never in a window)."""
        capacity = self.cache.capacity
        if self.windows is None or needed >= capacity:
            return capacity
        w = self.windows
        while w < needed:
            w *= 2
        return min(w, capacity - 1)

    def window(self, needed: int):
        """(window keys, the attached cache seen through that window): the same buffers, device length
        and host length, the buffers cut to the window's first keys."""
        w = self.window_keys(needed)
        if w == self.cache.capacity:
            return w, self.cache
        view = self._windows.get(w)
        if view is None:
            view = self._windows[w] = type(self.cache)(
                [k[:, :w] for k in self.cache.keys], [v[:, :w] for v in self.cache.values], None,
                self.cache.owner, self.cache.device_length)
        view.static_length = self.cache.static_length
        return w, view

    def __call__(self, tokens: Tensor, parents: Tensor, cache, positions: Tensor | None) -> Tensor:
        """Logits of one verification call: [M, V] for ``positions`` [M], or [N, B, V] for None: a view of
        the graph's output buffer in the shared pool, valid until the next call (copy it to keep it).
        Graphs hold the weights' addresses: make a new ``VerifyGraphs`` after moving or casting the model."""
        if cache is not self.cache:
            raise ValueError("cache: expected the static cache returned by attach (and write_block on it)")
        n, block = tokens.shape
        max_pos = self.model.config.max_position_embeddings
        if cache.length + block > max_pos:  # the graph cannot check it: nothing on the host runs in a replay
            raise ValueError(f"cache: prefix length {cache.length} + block {block} exceeds "
                             f"max_position_embeddings={max_pos}")
        m = None if positions is None else positions.shape[0]
        window, view = self.window(max(cache.length, 1))  # the call reads the prefix's keys
        key = (n, None if m is None else logit_rows_bucket(m, n * block), window)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = self._capture(view, tokens, parents, positions, key[1])
            self.captures += 1
        else:
            self._load(graph, tokens, parents, positions)
            graph.replay()
            self.replays += 1
        return graph.logits if m is None else graph.logits[:m]

    @staticmethod
    def _load(graph: _Graph, tokens, parents, positions) -> None:
        graph.tokens.copy_(tokens)
        graph.parents.copy_(parents)
        if positions is not None:
            m = positions.shape[0]
            graph.positions[:m].copy_(positions)
            graph.positions[m:].copy_(positions[-1:].expand(graph.positions.shape[0] - m))

    def write_block(self, cache, block_tokens: Tensor, compiled: bool = False, next_block: Tensor | None = None):
        """``model.write_block`` on the attached static cache through its window, replayed from a CUDA
        graph (one per block length, ``compiled``, window and whether ``next_block`` is verified with
        it, captured on first use; ``model.append_block_static``: the block's K/V written in place, no
        prefix copy), or launched when ``capture_writes`` is False. The checks run on the host first;
        ``cache.next_logits`` (and ``next_block_logits``) are copies out of the pool. Returns ``cache``."""
        if cache is not self.cache:
            raise ValueError("cache: expected the static cache returned by attach")
        p, s, causal = self.model.check_block(cache, block_tokens, None, compiled)
        fused = next_block is not None
        end = p + s + (int(next_block.shape[0]) if fused else 0)
        self.model.check_next_block(next_block, p + s, cache.capacity - 1)  # a window never holds the spare key
        window, view = self.window(end)  # the block's keys are written after the prefix's (and the next's)
        if not self.capture_writes:
            mark_dynamic_keys(view)  # one compiled write for every window
            self.model.write_block(view, block_tokens, causal, compiled, next_block=next_block)
            cache.next_logits, cache.next_block_logits = view.next_logits, view.next_block_logits
            cache.static_length = p + s
            return cache
        key = (s, causal, compiled, fused, window)
        graph = self.write_graphs.get(key)
        if graph is None:
            append = self.model.compiled_method("append_block_static") if compiled else self.model.append_block_static
            tokens = block_tokens.clone()  # the graph's input buffers
            nxt = next_block.clone() if fused else None
            mark_dynamic_keys(view)

            def call():
                return append(view.keys, view.values, cache.device_length, tokens, causal, nxt)

            logits, replay = self._record(call, tokens.device, restore=cache.device_length)
            graph = self.write_graphs[key] = _Graph(tokens, nxt, None, logits, replay)
            self.write_captures += 1
        else:
            graph.tokens.copy_(block_tokens)
            if fused:
                graph.parents.copy_(next_block)  # a write graph's second input: the next block's state
            graph.replay()
            self.write_replays += 1
        # the next replay of any graph may reuse the pool's memory: copies
        next_logits, block_logits = graph.logits
        cache.next_logits = next_logits.clone()
        cache.next_block_logits = None if block_logits is None else block_logits.clone()
        cache.static_length = p + s
        return cache

    def _capture(self, view, tokens, parents, positions, m_pad) -> _Graph:
        graph = _Graph(torch.empty_like(tokens), torch.empty_like(parents),
                       None if positions is None else positions.new_empty(m_pad), None, None)
        self._load(graph, tokens, parents, positions)
        mark_dynamic_shapes(graph.tokens, graph.parents, view, graph.positions)

        def call():
            if graph.positions is None:
                return self.forward(graph.tokens, graph.parents, view)
            return self.forward(graph.tokens, graph.parents, view, logit_positions=graph.positions)

        graph.logits, graph.replay = self._record(call, tokens.device)
        return graph

    def _record(self, call, device: torch.device, restore: Tensor | tuple[Tensor, ...] | None = None):
        """``record_call`` in the shared pool."""
        if self._pool is None and self.replay != "eager":
            self._pool = torch.cuda.graph_pool_handle()
        return record_call(call, device, self.replay, self._pool, restore)
