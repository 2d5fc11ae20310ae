"""CUDA graphs for the serving engine's batched passes (``Engine(cuda_graphs=True)``): the verification
forward and the block write (which also serves the engine's batched prefills) replayed, bucketed by
rows, so that a step costs the host a few copies and one replay instead of the launches of every layer.

Why: launched from the host, the engine's batched forward is host-bound at real shapes (docs/serving.md
measures it), and SpecFold's gates add launches and a count read a gate; a replay launches nothing.

What a replay reads. Every input sits in one static int64 buffer of its graph, filled by a single copy
from the host: the rows' tokens ``[R_pad, B]``, each row's prefix length (its RoPE positions), the
requests' row bounds, slots and prefix lengths (the ragged attention kernel's index tensors), the hidden
rows whose logits are wanted ``[M_pad]`` and, under SpecFold, the rows' parents offset to the
concatenation (forced fold masks, a benchmark's, in a second buffer). The pads: rows ``R..R_pad`` belong
to one extra request of empty prefix (they attend to their own block only) and, under SpecFold, fold
into row 0 at every gate, so they take no packed row; logit rows repeat the last one; the requests past
that one own no rows. What comes back is small: the confidence and token of every wanted position (the
commit rule's inputs; the logits never leave the graph) and, under SpecFold, the fold masks and an
overflow flag.

Buckets: ``R_pad`` and ``M_pad`` in the series 8, 12, 16, 24, 32, 48, ... (``row_bucket``: powers of two
and 1.5 times them, so at most a third is padding), the request count plus the padding request to a
power of two; under SpecFold also the rounds of pointer jumping (``gate_ref.FoldChains``). One graph per
bucket, captured the first time it comes after one launched call (which compiles and tunes the
kernels), all in one memory pool; graphs are replayed one at a time and their outputs read before the
next replay.

SpecFold without reading a count: each gate of a graph packs a fixed number of positions, its
capacity: every position of the requests' main rows plus its share (``fold_capacity``: one number for
every gate, or one a gate: the share of draft positions it is expected to compute) of the draft rows'
positions, times a margin ``1 + capacity_spread / sqrt(D)`` for ``D`` draft rows (the mean share of
many rows strays less from its expectation than that of a few), both counts rounded up by at most an
eighth (``fine_bucket``), and at least ``min_packed`` positions (below that a GEMM costs what reading
its weights costs, so packing fewer saves little); every position at ``tau = 0``, which folds nothing.
A gate resolves its origins and puts its computed positions first (``capacity_gates``: one Triton launch
wherever Triton runs, no host read), and the first ``capacity`` of them go through the GEMMs. A gate that
computes more sets the overflow flag, read back with the fold masks; the forward is then replayed from
the graph of the next capacity level (every share doubled, up to every position, which cannot overflow;
its inputs are the same and a verification forward writes nothing), so an overflow costs a replay,
never a token. The deeper layers of a model fold less than the first ones, so a share a gate
(``capacity_from_masks``, from the fold masks of earlier requests) packs fewer rows than one share for
all.

Block writes: one graph per padded block count; each block's K/V go into its slot at its length by one
indexed copy a layer (the padding's into the pool's spare slot), and the graph gives each block's next
seed token. ``replay="eager"`` runs the same buffers and padding with the function called again instead
of a graph replayed: the CPU path, for tests, and to bisect a wrong result between the bookkeeping and
the capture.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import ops
from ..decoding.commit import confidence
from ..decoding.cuda_graphs import REPLAYS
from ..decoding.graph_capture import capture_call
from ..models.layers import PositionTables
from ..reference import chain_depth, check_gate, folded_layers, gate_count
from .capacity_gates import CapacityGates, check_gate_kernel
from .compiled import (base_model, check_compile_layers, check_packed_attention, compiled_model, folded_pieces,
                       gate_test)
from .forward import row_bounds
from .pool import KVPool

__all__ = ["BatchGraphs", "VerifyResult", "row_bucket", "request_bucket", "fine_bucket", "capacity_from_masks",
           "REPLAYS", "MIN_PACKED", "CAPACITY_SPREAD", "check_cuda_graphs", "shared_graphs"]

SMALLEST_BUCKET = 8
# positions a SpecFold gate packs at least (module docstring): on an H200 one 7B layer's position-wise
# GEMMs take 247 / 316 / 504 us at 128 / 256 / 512 rows, then grow with the rows (bench.packed_rows)
MIN_PACKED = 256
# the margin a graph packs over a gate's share: 1 + CAPACITY_SPREAD / sqrt(draft rows), as the computed
# share of D draft rows strays from its mean by about 1 / sqrt(D) of it (module docstring)
CAPACITY_SPREAD = 4.0


def row_bucket(n: int, least: int = SMALLEST_BUCKET) -> int:
    """The padded size of ``n`` rows: the first of ``least``, then 1.5x and 4/3x in turn (8, 12, 16, 24,
    32, ...), at least ``n``."""
    b = least
    while b < n:
        b = b * 3 // 2 if b & (b - 1) == 0 else b * 4 // 3
    return b


def fine_bucket(n: int) -> int:
    """``n`` rounded up to ``m * 2^k`` with ``m`` in ``[8, 16)``: at most an eighth more (0 stays 0)."""
    if n <= 8:
        return n
    step = 1 << (n.bit_length() - 4)  # n in [8 * step, 16 * step)
    return -(-n // step) * step


def request_bucket(n: int) -> int:
    """The request count a graph is made for: ``n`` requests plus the padding's, to a power of two."""
    return 1 << n.bit_length()  # the smallest power of two > n


def check_fold_capacity(value, gates: int | None = None) -> float | tuple[float, ...]:
    """``fold_capacity``: a number in (0, 1], or a sequence of them, one a gate (``gates`` of them when
    given); a one-line error naming the argument otherwise."""
    what = "a number in (0, 1] or a sequence of them, one a gate (the share of draft positions a gate computes)"
    if isinstance(value, (list, tuple)):
        if not value or (gates is not None and len(value) != gates):
            raise ValueError(f"fold_capacity: expected {what}{f', {gates} of them' if gates else ''}, got "
                             f"{len(value)} numbers")
        return tuple(check_fold_capacity(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"fold_capacity: expected {what}, got {value!r}")
    return float(value)


def capacity_from_masks(fold_masks, margin: float = 1.0, step: float = 1 / 32) -> tuple[float, ...]:
    """A ``fold_capacity`` a gate from fold masks of earlier forwards (bool ``[G, N, B]`` each, row 0 the
    main branch: ``RequestOutput.fold_masks``): each gate's share of draft positions computed, times
    ``margin``, rounded up to a multiple of ``step`` (so that nearby workloads give the same graphs),
    within ``[step, 1]``."""
    computed, total = None, 0
    for m in fold_masks:
        drafts = ~m[:, 1:].reshape(m.shape[0], -1)
        computed = drafts.sum(1) if computed is None else computed + drafts.sum(1)
        total += drafts.shape[1]
    if computed is None or total == 0:
        raise ValueError("fold_masks: expected at least one mask with draft rows ([G, N, B], N >= 2)")
    shares = computed.double() / total * margin
    return tuple(min(1.0, max(step, math.ceil(float(x) / step - 1e-9) * step)) for x in shares)


@dataclass
class VerifyResult:
    """A replayed verification forward, on the host: each wanted position's ``conf`` and ``tok`` (in the
    requests' ``logit_positions`` order, concatenated); under SpecFold each request's fold masks (bool
    ``[G, N_i, B]``) and ``overflows``: how many graphs the forward overflowed (some gate computed more
    positions than it packs) before the one that gave these numbers. ``verify(read_folds=False)``: no
    masks yet; ``folds`` the graph's packed masks and overflow flag, unread on the device (``split_folds``),
    ``final`` whether that graph packs every position (it cannot overflow)."""

    conf: Tensor
    tok: Tensor
    masks: list[Tensor] | None = None
    overflows: int = 0
    folds: Tensor | None = None
    final: bool = True


@dataclass
class _Graph:
    inputs: Tensor          # int64, every index input, views below
    masks_in: Tensor | None  # bool [G, R_pad, B], forced masks (or None: gated)
    outputs: tuple
    replay: object


class BatchGraphs:
    """The engine's batched passes as graph replays (module docstring), over their own ``KVPool`` (with a
    spare slot): ``pool``. Keep one across engines of one model (``Engine(cuda_graphs=graphs)``, each
    engine's slots at most the pool's) to reuse its graphs. ``fold_capacity``: the share of the draft
    rows' positions a SpecFold gate is expected to compute, one for all or one a gate (module docstring),
    ``capacity_spread`` the margin a graph packs over it, ``min_packed`` the positions a gate packs at
    least; ``gate``: SpecFold's gates, as in ``folded.verify_batch_folded``; ``compile_layers``: the
    layers' position-wise pieces compiled (``compiled``' module docstring), captured compiled;
    ``gate_kernel``: how the SpecFold gates resolve and pack (``capacity_gates.check_gate_kernel``: None,
    the default, by the Triton kernel wherever Triton runs; False by tensor ops); ``packed_attention``:
    SpecFold's attention reads the packed rows' q, k, v (``ops.folded_ragged_attention``: each computed
    position's prefix walked once, two launches a layer) instead of every position's (``ops.ragged_attention``,
    one launch)."""

    def __init__(self, model, max_requests: int, max_tokens_per_request: int, replay: str = "cuda",
                 fold_capacity: float | tuple[float, ...] = 0.5, gate: str = "layer", min_packed: int = MIN_PACKED,
                 capacity_spread: float = CAPACITY_SPREAD, compile_layers: bool | str = False,
                 gate_kernel: bool | None = None, packed_attention: bool = False):
        if replay not in REPLAYS:
            raise ValueError(f"replay: expected one of {REPLAYS}, got {replay!r}")
        check_gate(gate)
        if isinstance(min_packed, bool) or not isinstance(min_packed, int) or min_packed < 0:
            raise ValueError(f"min_packed: expected an int >= 0 (positions a gate packs at least), got "
                             f"{min_packed!r}")
        if (isinstance(capacity_spread, bool) or not isinstance(capacity_spread, (int, float))
                or not capacity_spread >= 0):
            raise ValueError(f"capacity_spread: expected a number >= 0 (the margin over a gate's share is "
                             f"spread / sqrt(draft rows)), got {capacity_spread!r}")
        self.compile_layers = check_compile_layers(compile_layers)
        self.gate_kernel = check_gate_kernel(gate_kernel, next(model.parameters()).device)
        self.packed_attention = check_packed_attention(packed_attention)
        self.model = compiled_model(model, self.compile_layers)
        self.replay, self.gate, self.min_packed = replay, gate, min_packed
        self.capacity_spread = float(capacity_spread)
        n_gates = gate_count(len(model.layers), gate)
        self.fold_capacity = check_fold_capacity(fold_capacity, n_gates)
        self._shares = (self.fold_capacity if isinstance(self.fold_capacity, tuple)
                        else (self.fold_capacity,) * n_gates)
        self.pool = KVPool(model, max_requests, max_tokens_per_request, spare_slot=True)
        if replay == "cuda" and self.pool.device.type != "cuda":
            raise ValueError(f"replay: 'cuda' needs the model on a CUDA device, got {self.pool.device}")
        self.block = int(model.config.block_size)
        self.mask_id = int(model.config.mask_token_id)
        self.graphs: dict[tuple, _Graph] = {}
        # the device loop's step bookkeeping (serving.device_steps.SlotSteps.for_engine), shared like the graphs
        self.slot_steps: dict[tuple, object] = {}
        self.captures = self.replays = 0
        self._tau = torch.zeros((), dtype=torch.float32, device=self.pool.device)
        self._handle = None

    # --- verification -----------------------------------------------------------------------------
    def verify(self, slots: list[int], rows: list[Tensor], logit_positions: list[Tensor],
               confidence_dtype: str, parents: list[list[int]] | None = None, tau: float | None = None,
               forced: list[Tensor] | None = None, on_device: bool = False, read_folds: bool = True,
               first_level: int = 0) -> VerifyResult:
        """One verification forward over requests in ``slots`` (``rows[i]`` int64 ``[N_i, B]``, all on the
        host or all on the pool's device, ``logit_positions[i]`` its flat positions ``n * B + p`` whose
        confidences are wanted), as ``forward.verify_batch`` with ragged attention; with ``parents`` (each
        request's, host lists) the folded forward at ``tau`` (``forced``: each request's fold masks, bool
        ``[G, N_i, B]``). ``on_device``: the confidences stay on the pool's device (copies), else on the
        host. ``read_folds=False``: the folded forward not waited for (``VerifyResult.folds``: the caller
        reads its masks and overflow flag later, with its own results); ``first_level``: the capacity level
        it starts at (``_capacity``)."""
        counts = [int(r.shape[0]) for r in rows]
        n_rows, n_req, block = sum(counts), len(rows), self.block
        r_pad, q_pad = row_bucket(n_rows), request_bucket(n_req)
        bounds = row_bounds(counts)
        flat = torch.cat([p.cpu() + bounds[i] * block for i, p in enumerate(logit_positions)])
        hidden = self.model.logit_rows(flat, block)
        m, m_pad = int(hidden.numel()), row_bucket(int(hidden.numel()), 16)
        folded = parents is not None
        depth = rounds_depth(parents) if folded else 0
        lengths = [self.pool.lengths[s] for s in slots]
        tokens = torch.cat(rows)
        pad = r_pad - n_rows
        parts = [torch.tensor([x for x, c in zip(lengths, counts) for _ in range(c)] + [0] * pad),
                 torch.tensor(bounds + [r_pad] * (q_pad - n_req)),
                 torch.tensor(list(slots) + [self.pool.spare] * (q_pad - n_req)),
                 torch.tensor(lengths + [0] * (q_pad - n_req)),
                 torch.cat((hidden, hidden[-1:].expand(m_pad - m)))]
        if folded:
            offset = [p + bounds[i] if p >= 0 else -1 for i, ps in enumerate(parents) for p in ps]
            parts += [torch.tensor(offset + [0] * pad),  # the padding folds into row 0 ...
                      torch.tensor([0] * n_rows + [1] * pad)]  # ... at every gate
        # the rows' tokens where they are (on the device: a copy there), the rest in one copy from the host
        inputs = [torch.cat((tokens, tokens[:1].expand(pad, block))).flatten(), torch.cat(parts)]
        masks_in = None
        if forced is not None:
            for i, f in enumerate(forced):
                if bool(f[:, 0].any()):
                    raise ValueError(f"fold_masks[{i}]: row 0 (the request's main branch) never folds")
            masks_in = torch.cat([m.cpu() for m in forced] + [torch.ones(len(forced[0]), pad, block, dtype=torch.bool)],
                                 dim=1)
        if folded:
            self._tau.fill_(float(tau))

        overflows = 0
        for level in itertools.count(first_level):
            capacity = self._capacity(r_pad, n_req, n_rows, tau, level) if folded else ()
            key = ("verify", r_pad, q_pad, m_pad, confidence_dtype, folded, depth, capacity, forced is not None)

            def call(graph, capacity=capacity):
                return self._verify_call(graph, r_pad, q_pad, m_pad, confidence_dtype, folded, depth, capacity)

            graph = self._run(key, inputs, masks_in, call)
            if not folded:
                break
            final = all(c == r_pad * block for c in capacity)  # every position packed: it cannot overflow
            if not read_folds:  # copies below, as of the confidences
                return VerifyResult(*(t[:m].clone() for t in graph.outputs[:2]), folds=graph.outputs[2].clone(),
                                    final=final)
            # one read: the fold masks and, in the same buffer, the overflow flag
            masks, overflow = split_folds(graph.outputs[2], counts)
            if not overflow or final:
                break
            overflows += 1
        # copies: the next replay overwrites the graph's outputs (``.cpu()`` alone is a view on the CPU)
        conf, tok = (t[:m].clone() if on_device else t[:m].to("cpu", copy=True) for t in graph.outputs[:2])
        if not folded:
            return VerifyResult(conf, tok)
        return VerifyResult(conf, tok, masks, overflows)

    def _capacity(self, r_pad: int, n_req: int, n_rows: int, tau: float, level: int = 0) -> tuple[int, ...]:
        """The positions each gate of a SpecFold graph packs, for ``n_req`` requests of ``n_rows`` rows in
        all padded to ``r_pad``: every position at tau = 0; else the main rows' positions and the gate's
        share of the draft rows', times ``1 + capacity_spread / sqrt(draft rows)`` (doubled ``level``
        times, at most 1), both counts first rounded up by ``fine_bucket`` (so that nearby batches share
        a graph), and at least ``min_packed``."""
        full = r_pad * self.block
        if float(tau) == 0:
            return (full,) * len(self._shares)
        n_drafts = fine_bucket(n_rows - n_req)
        mains, drafts = fine_bucket(n_req) * self.block, n_drafts * self.block
        margin = (1 + self.capacity_spread / math.sqrt(max(n_drafts, 1))) * 2 ** level
        return tuple(min(full, max(self.min_packed, mains + math.ceil(min(1.0, s * margin) * drafts)))
                     for s in self._shares)

    def _verify_call(self, graph: _Graph, r_pad: int, q_pad: int, m_pad: int, confidence_dtype: str, folded: bool,
                     depth: int, capacity: tuple[int, ...]):
        model, block, pool = self.model, self.block, self.pool
        sizes = [r_pad * block, r_pad, q_pad + 1, q_pad, q_pad, m_pad] + ([r_pad, r_pad] if folded else [])
        tokens, starts, bounds, slots, lengths, hidden, *rest = graph.inputs.split(sizes)
        positions = (starts[:, None] + torch.arange(block, device=starts.device)).flatten()
        tables = model.position_tables(positions)  # per flat row n * B + b
        h = model.embed_tokens(tokens.view(r_pad, block))

        def attend(index, layer, q, k, v):
            return ops.ragged_attention(q, k, v, pool.keys[index], pool.values[index], bounds, slots, lengths,
                                        layer.scale)

        if folded:
            gates = CapacityGates(rest[0], block, depth, self._tau, capacity, rest[1].bool(), graph.masks_in,
                                  self.gate_kernel, gate_test(model))
            layers, pieces = folded_pieces(model, self.packed_attention)

            def attend_folded(index, layer, q, k, v, packed_rows, slot):
                if self.packed_attention:  # q, k, v of the packed rows
                    return ops.folded_ragged_attention(q, k, v, packed_rows, slot, pool.keys[index],
                                                       pool.values[index], bounds, slots, lengths, layer.scale)
                return attend(index, layer, q, k, v)
            h = folded_layers(layers, h, gates, tables, attend_folded, self.gate, pieces)
        else:
            pos = _by_row(tables, r_pad, block)
            for index, layer in enumerate(model.layers):
                q, k, v = layer.qkv(h, pos)
                h = h + layer.attn_out(attend(index, layer, q, k, v))
                h = h + layer.mlp_out(h)
        logits = model.head(model.norm(h.flatten(0, 1).index_select(0, hidden)))
        conf, tok = confidence(logits, self.mask_id, confidence_dtype, model.config.decoding_rules.argmax_of_probs)
        if not folded:
            return conf, tok
        # the overflow flag rides in one more row of the masks: one copy brings both back
        flag = gates.overflow.expand(len(gates.masks), 1, block)
        return conf, tok, torch.cat((torch.stack(gates.masks), flag), dim=1)

    # --- block writes -----------------------------------------------------------------------------
    def write(self, slots: list[int], blocks: list[Tensor], read: bool = True):
        """Append one finished block (int64 ``[S]``, host) to each slot's prefix, as ``forward.write_blocks``;
        returns each request's next-block seed token (the argmax, the mask excluded, of its last position's
        logits: ``request.seed_tokens``), or (``read=False``) at once a function that waits and reads them:
        the host may work meanwhile, and calls it before the next pass, whose replay reuses the buffers."""
        s, n = int(blocks[0].shape[0]), len(blocks)
        for slot in slots:
            self.pool._check_room(slot, s, self.pool.lengths[slot])
        q_pad = request_bucket(n - 1)  # no padding request here: n blocks to a power of two
        pad = q_pad - n
        lengths = [self.pool.lengths[slot] for slot in slots] + [0] * pad
        tokens = torch.cat((torch.stack(blocks), blocks[0].unsqueeze(0).expand(pad, s)))
        inputs = torch.cat((tokens.flatten(), torch.arange(q_pad + 1),
                            torch.tensor(list(slots) + [self.pool.spare] * pad), torch.tensor(lengths)))
        graph = self._run(("write", s, q_pad), [inputs], None, lambda g: self._write_call(g, s, q_pad))
        for slot in slots:
            self.pool.advance(slot, s)
        return graph.outputs[0][:n].tolist() if read else graph.outputs[0][:n].tolist

    def _write_call(self, graph: _Graph, s: int, q_pad: int):
        model, pool = self.model, self.pool
        tokens, bounds, slots, lengths = graph.inputs.split([q_pad * s, q_pad + 1, q_pad, q_pad])
        offsets = torch.arange(s, device=tokens.device)
        at = lengths[:, None] + offsets                                  # [Q, S] each key's position
        tables = model.position_tables(at.flatten())
        pos = _by_row(tables, q_pad, s)
        where = (slots[:, None].expand(q_pad, s), at)
        causal = model.config.family == "nld"
        h = model.embed_tokens(tokens.view(q_pad, s))
        for index, layer in enumerate(model.layers):
            q, k, v = layer.qkv(h, pos)  # [Q, S, H, D]
            o = ops.ragged_attention(q, k, v, pool.keys[index], pool.values[index], bounds, slots, lengths,
                                     layer.scale, causal)
            # after the attention, which read only the first `lengths` keys of each slot
            pool.keys[index].permute(0, 2, 1, 3).index_put_(where, k)
            pool.values[index].permute(0, 2, 1, 3).index_put_(where, v)
            h = h + layer.attn_out(o)
            h = h + layer.mlp_out(h)
        logits = model.head(model.norm(h[:, -1]))
        return (confidence(logits, self.mask_id)[1],)

    # --- capture and replay -----------------------------------------------------------------------
    def _run(self, key: tuple, inputs: list[Tensor], masks_in: Tensor | None, call) -> _Graph:
        """Replay (or capture, the first time) the graph of ``key``; ``inputs``: the pieces of its input
        buffer in order, each copied in where it lies (host or device)."""
        graph = self.graphs.get(key)
        if graph is not None:
            at = 0
            for piece in inputs:
                graph.inputs[at:at + piece.numel()].copy_(piece, non_blocking=True)
                at += piece.numel()
            if masks_in is not None:
                graph.masks_in.copy_(masks_in, non_blocking=True)
            graph.replay()
            self.replays += 1
            return graph
        device = self.pool.device
        graph = _Graph(torch.cat([piece.to(device) for piece in inputs]), None if masks_in is None else masks_in.to(device), (), None)
        if self.replay == "eager":
            graph.outputs = call(graph)

            def again():
                for out, new in zip(graph.outputs, call(graph)):
                    out.copy_(new)
            graph.replay = again
        else:
            if self._handle is None:
                self._handle = torch.cuda.graph_pool_handle()
            graph.outputs, graph.replay = capture_call(lambda: call(graph), device, self._handle)
        self.graphs[key] = graph
        self.captures += 1
        return graph


def check_cuda_graphs(cuda_graphs, attention) -> bool:
    """Whether the engine replays its passes (``cuda_graphs`` checked: False, True, "eager" or a
    ``BatchGraphs``; graphs need the ragged attention)."""
    if not (isinstance(cuda_graphs, (bool, BatchGraphs)) or cuda_graphs == "eager"):
        raise ValueError(f"cuda_graphs: expected False, True, 'eager' or a BatchGraphs, got {cuda_graphs!r}")
    if cuda_graphs is False:
        return False
    if attention not in ("auto", "ragged"):
        raise ValueError(f"attention: cuda_graphs replays the ragged attention ('auto' or 'ragged'), got "
                         f"{attention!r}")
    return True


def shared_graphs(graphs: BatchGraphs, model, max_requests: int, max_tokens_per_request: int,
                   backend: str | None) -> BatchGraphs:
    """A ``BatchGraphs`` handed to a new engine: the same model compiled alike, room for its slots, no slot
    in use."""
    if base_model(graphs.model) is not model:
        raise ValueError("cuda_graphs: a BatchGraphs made for another model")
    if graphs.compile_layers != backend:
        raise ValueError(f"compile_layers: the shared BatchGraphs runs its layers "
                         f"{'compiled by ' + repr(graphs.compile_layers) if graphs.compile_layers else 'eagerly'}; "
                         f"pass the same compile_layers to the engine")
    if max_requests > graphs.pool.max_requests or max_tokens_per_request != graphs.pool.capacity:
        raise ValueError(f"cuda_graphs: its pool has {graphs.pool.max_requests} slots of "
                         f"{graphs.pool.capacity} positions, the engine asks {max_requests} of "
                         f"{max_tokens_per_request}")
    if graphs.pool.used_slots:
        raise ValueError(f"cuda_graphs: {graphs.pool.used_slots} of its pool's slots are still in use by "
                         "another engine")
    return graphs


def _by_row(tables: PositionTables, rows: int, block: int) -> PositionTables:
    """Tables of ``rows * block`` flat positions viewed as ``[rows, block, ...]``."""
    def view(t):
        return None if t is None else t.view(rows, block, *t.shape[1:])
    return PositionTables(view(tables.cos), view(tables.sin), view(tables.q_scale))


def split_folds(folds: Tensor, counts: list[int]) -> tuple[list[Tensor], bool]:
    """A SpecFold graph's one output ``[G, R_pad + 1, B]`` (``VerifyResult.folds``), copied to the host at
    once: each request's fold masks (``counts``: its rows) and the overflow flag (in the last row)."""
    host = folds.to("cpu", copy=True)
    return list(host[:, :sum(counts)].split(counts, dim=1)), bool(host[0, -1, 0])


def rounds_depth(parents: list[list[int]]) -> int:
    """The chain depth a folded graph resolves: the requests' longest fold chain (``chain_depth``) to a
    power of two (the same pointer-jumping rounds; one graph for every depth in the bucket), at least 1
    for the padding rows' links to row 0."""
    depth = max([chain_depth(p) for p in parents] + [1])
    return 1 << (depth - 1).bit_length()
