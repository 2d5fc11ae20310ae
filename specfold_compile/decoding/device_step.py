"""One decode step's bookkeeping as tensor ops: static shapes, no read back to the host.

The Python loop (``decoder._decode``) is the readable reference; this module computes the same things
on the device so that a whole step, the verification forward and its bookkeeping, can be one CUDA graph
replay (``device_loop``). Given the rows of one verification call ``[N, B]`` (row 0 the main state X; on
an N = 1 + draft_budget call the rows past the real drafts are padding, copies of X with parent 0, so
the shapes never change) and their logits ``[N, B, V]``:

1. ``confidence`` per position (``commit.confidence``, the same dtype rule);
2. the commit rule on X (``commit_rule``: sub-block window, threshold, the most confident position);
3. Spiffy's acceptance walk (``acceptance_walk``): while the committed state Y is not finished and a
   draft row equals Y, that row's logits are ``model(Y)``: accept it and commit again;
4. the finished flag of the new main state (``finished``: the block's counted positions, eos);
5. the next call's draft rows (``draft_rows``): the draft graph instantiated on the new state through
   the confidence ranks, merged, filtered and pruned to the budget as ``graph.build_drafts`` and
   ``graph.prune_nodes`` do, the graph held as index tensors (``DraftTables``).

Every data-dependent choice is a mask, an ``argmax`` or a stable sort, and every loop has a static trip
count (the walk and the pruning ``draft_budget`` iterations, the subtree values the graph's depth), so
nothing here reads a value on the host. The pruning scores are float64 as the reference's Python floats;
only the order of the floating-point sums differs from it, which could change the choice between two
drafts whose values agree to the last bit (the drafts change the number of forwards, never the tokens).
"""

from __future__ import annotations

import logging
import struct
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from .commit import confidence
from .graph import DraftGraph

__all__ = ["StepRules", "DraftTables", "CompiledStep", "finished", "commit_rule", "rank_of_positions", "draft_rows",
           "acceptance_walk", "decode_step", "threshold_in", "step_from_confidences", "prefix_of_drafts",
           "STATUS_FIELDS"]

# The status word of a step (int64): the new main state's finished flag, draft rows accepted, the step
# made no progress (non-finite logits), the call's real rows, the argmax at position 0 of the row whose
# logits produced the new state (under the Fast-dLLM shift: the predicted token after the block,
# ``generate(fuse_boundaries=True)``'s guess of the next seed), and the new main state's masked positions
# (how many positions the next call needs logits for, besides position 0); the call's parents follow.
STATUS_FIELDS = ("finished", "accepted", "stalled", "rows", "seed_guess", "masked")

# Graphs a compiled step keeps per Python function: one a kind of decode and padded request count; Dynamo's
# default (8) would turn the later ones silently eager.
STEP_RECOMPILE_LIMIT = 64
log = logging.getLogger("specfold_compile")


@dataclass(frozen=True)
class StepRules:
    """How one decode turns logits into commits and drafts (``generate``'s arguments and the model's
    ``DecodingRules``). ``eos_id`` None: eos does not finish a block (``stop_at_eos=False``).
    ``draft_budget``: draft rows per call, 0 for vanilla."""

    block_size: int
    sub_block_size: int | None
    mask_id: int
    eos_id: int | None
    threshold: float
    inclusive: bool
    confidence_dtype: str
    argmax_of_probs: bool
    draft_budget: int = 0


@dataclass(frozen=True)
class DraftTables:
    """A ``DraftGraph`` as tensors: ``ranks`` bool [G, B + 1] (column r: rank r is in node's set),
    ``parents`` bool [G, G] (node j's parents), ``level1`` bool [G] (children of the root) and ``depth``,
    an upper bound of the longest chain of drafts (a child's rank set is strictly larger)."""

    ranks: Tensor
    parents: Tensor
    level1: Tensor
    depth: int

    @classmethod
    def from_graph(cls, graph: DraftGraph, device: torch.device | str = "cpu") -> "DraftTables":
        g, b = len(graph), graph.block_size
        ranks = torch.zeros(g, b + 1, dtype=torch.bool)
        parents = torch.zeros(g, g, dtype=torch.bool)
        for j, ((_, s), ps) in enumerate(zip(graph.nodes, graph.parents)):
            ranks[j, sorted(s)] = True
            parents[j, list(ps)] = True
        level1 = torch.tensor([not ps for ps in graph.parents], dtype=torch.bool)
        depth = min(g, max((len(s) for _, s in graph.nodes), default=0))
        return cls(ranks.to(device), parents.to(device), level1.to(device), depth)


def _positions(state: Tensor) -> Tensor:
    return torch.arange(state.shape[-1], device=state.device)


def _row(x: Tensor, i: Tensor) -> Tensor:
    """``x[i]`` for a 0-dim index tensor without reading it on the host (a 0-dim tensor index would)."""
    return x.index_select(0, i.reshape(1))[0]


def finished(states: Tensor, info: Tensor, rules: StepRules) -> Tensor:
    """``commit.block_finished`` of states [..., B] -> bool [...]: no mask among the counted positions
    ``[start, start + need)`` (``info`` = [start, need]), or a committed eos there before the first mask."""
    pos = _positions(states)
    counted = (pos >= info[0]) & (pos < info[0] + info[1])
    masked = (states == rules.mask_id) & counted
    done = ~masked.any(-1)
    if rules.eos_id is None:
        return done
    first_mask = torch.where(masked, pos, states.shape[-1]).amin(-1, keepdim=True)
    eos_first = ((states == rules.eos_id) & counted & (pos < first_mask)).any(-1)
    return done | eos_first


def commit_rule(state: Tensor, conf: Tensor, tok: Tensor, rules: StepRules) -> Tensor:
    """``commit.commit`` on states [..., B] (each row its own): the window's positions above the
    threshold (compared in ``conf``'s dtype), at least its most confident one (ties: the lowest position)."""
    pos = _positions(state)
    masked = state == rules.mask_id
    window = masked
    if rules.sub_block_size is not None:
        first = torch.where(masked, pos, state.shape[-1]).amin(-1, keepdim=True)
        window = masked & (pos // rules.sub_block_size == first // rules.sub_block_size)
    threshold = threshold_in(conf.dtype, rules.threshold)
    c = conf.float() if conf.dtype in (torch.bfloat16, torch.float16) else conf
    above = (c >= threshold) if rules.inclusive else (c > threshold)
    sel = window & above
    best = torch.argmax(torch.where(window, conf, torch.full_like(conf, float("-inf"))), -1, keepdim=True)
    fallback = (pos == best) & window & ~sel.any(-1, keepdim=True)
    return torch.where(sel | fallback, tok, state)


def threshold_in(dtype: torch.dtype, threshold: float) -> float:
    """The threshold as ``conf > threshold`` compares it for a ``dtype`` tensor (a Python float cast to the
    tensor's dtype, through float32), as a float: bf16 and fp16 confidences compare as float32 with it,
    the same outcome, and a compiled graph cannot compare them against an unrounded constant instead."""
    if dtype == torch.float16:
        single = struct.unpack("<f", struct.pack("<f", threshold))[0]
        return struct.unpack("<e", struct.pack("<e", single))[0]
    if dtype == torch.bfloat16:
        bits = struct.unpack("<I", struct.pack("<f", threshold))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16  # round to nearest, ties to even
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    return threshold


def rank_of_positions(state: Tensor, conf: Tensor, rules: StepRules) -> Tensor:
    """``commit.rank_masked_positions`` as ranks: int64 [B], the masked positions' ranks 1..m in draft
    order (sub-block first, then descending ``conf``, ties by position), the others ranks above m."""
    pos = _positions(state)
    masked = state == rules.mask_id
    by_conf = torch.sort(conf, descending=True, stable=True).indices
    group = pos // rules.sub_block_size if rules.sub_block_size is not None else torch.zeros_like(pos)
    group = torch.where(masked, group, state.shape[-1])  # unmasked positions last
    order = by_conf[torch.sort(group[by_conf], stable=True).indices]
    return torch.empty_like(order).scatter(0, order, pos + 1)  # out of place: torch.vmap batches it


def draft_rows(root: Tensor, conf: Tensor, tok: Tensor, info: Tensor, rules: StepRules,
               tables: DraftTables, order: bool = False) -> tuple[Tensor, ...]:
    """``graph.build_drafts`` on the main state ``root`` [B] with the logits that produced it (``conf``,
    ``tok`` [B]): rows [D, B] (padding rows: copies of ``root``), fold parents [D] in row numbering
    (0 = main) and the number of real drafts (int64 []). ``order``: also int64 [D, 2], each row's turn
    in the pruning's greedy choice (0 first; padding rows D) and the bit set of its parents among the
    rows (bit 0 the main row), from which ``prefix_of_drafts`` takes ``build_drafts`` with a smaller
    budget: the greedy choice does not depend on the budget, so a smaller one keeps its first picks."""
    d, g = rules.draft_budget, tables.ranks.shape[0]
    nodes = torch.arange(g, device=root.device)
    masked = root == rules.mask_id
    m = masked.sum()
    rank = rank_of_positions(root, conf, rules)
    eff = tables.ranks[:, rank] & masked[None]  # [G, B]: the node's committed positions
    size = eff.sum(-1)
    empty, valid = size == 0, (size > 0) & (size < m)
    same = (eff[:, None, :] == eff[None, :, :]).all(-1)
    rep = torch.where(same, nodes[None], g).amin(-1)  # first node with the same set
    member = (rep[:, None] == nodes[None]) & valid[:, None]  # node j belongs to candidate c
    is_cand = member.any(0)
    node_edge = tables.parents & valid[:, None] & valid[None] & (rep[:, None] != rep[None])
    node_root = valid & (tables.level1 | (tables.parents & empty[None]).any(-1))
    mf = member.float()  # 0/1 counts below G * G: exact in float32
    edge = (mf.t() @ node_edge.float() @ mf) > 0  # edge[c, d]: d is a parent of c
    root_child = (mf.t() @ node_root.float()) > 0
    states = torch.where(eff, tok[None], root[None])
    alive = is_cand & ~finished(states, info, rules)

    logc = conf.double().clamp_min(1e-30).log()
    score = torch.exp(torch.where(eff, logc[None], 0.0).sum(-1) / size.clamp_min(1))
    # topological order as the reference's: by set size, then first appearance (node order)
    perm = torch.sort(torch.where(alive, size, rules.block_size + 1), stable=True).indices
    alive_s, root_s = alive[perm], root_child[perm]
    parent_s = edge[perm][:, perm] & alive_s[:, None] & alive_s[None]  # [i, p]: p a parent of i
    children = parent_s.t()
    s = torch.where(alive_s, score[perm], 0.0)
    t, ones, weights = s, torch.ones_like(s), children.double()
    for _ in range(tables.depth):  # t(i) = s(i) * (1 + sum of its children's t), leaves first
        t = s * torch.addmv(ones, weights, t)

    frontier, chosen = root_s & alive_s, torch.zeros_like(alive_s)
    minus_inf = torch.full_like(t, float("-inf"))
    turn = torch.full_like(nodes, d)
    for k in range(d):  # greedy: the reachable node of highest t (ties: the lowest index)
        pick = (nodes == torch.argmax(torch.where(frontier, t, minus_inf))) & frontier  # none once it is empty
        chosen = chosen | pick
        turn = torch.where(pick, k, turn)
        frontier = (frontier | (children & pick[:, None]).any(0)) & ~chosen

    row_number = torch.cumsum(chosen.long(), 0)  # chosen node i -> row row_number[i] (1-based)
    fold = torch.where(parent_s & chosen[None], row_number[None], g + 1).amin(-1)
    fold = torch.where(root_s | (fold > g), 0, fold)  # the first parent in row order, the root first
    slot = (row_number[None] == torch.arange(1, d + 1, device=root.device)[:, None]) & chosen[None]  # [D, G]
    has, pick_i = slot.any(-1), slot.long().argmax(-1)
    states_s = states[perm]
    rows = torch.where(has[:, None], states_s[pick_i], root[None])
    parents = torch.where(has, fold[pick_i], 0)
    if not order:
        return rows, parents, chosen.sum()
    bit = torch.where(chosen, torch.bitwise_left_shift(torch.ones_like(row_number), row_number), 0)
    parent_bits = (parent_s.long() * bit[None]).sum(-1) + root_s.long()  # distinct powers of two: their union
    return rows, parents, chosen.sum(), torch.stack([torch.where(has, turn[pick_i], d),
                                                     torch.where(has, parent_bits[pick_i], 0)], -1)


def prefix_of_drafts(parents_bits: list[int], turns: list[int], budget: int) -> tuple[list[int], list[int]]:
    """The drafts ``build_drafts`` keeps with ``budget`` from those it keeps with a larger one, given
    their turns and parent bit sets (``draft_rows(order=True)``; row ``j + 1`` of the call is draft
    ``j``): the kept drafts' indices, ascending, and their fold parents renumbered (the first parent
    kept, the main row 0 first)."""
    keep = [j for j, turn in enumerate(turns) if turn < budget]
    row_of = {j + 1: r + 1 for r, j in enumerate(keep)}
    parents = []
    for j in keep:
        kept = [0 if p == 0 else row_of[p] for p in range(parents_bits[j].bit_length())
                if parents_bits[j] >> p & 1 and (p == 0 or p in row_of)]
        parents.append(min(kept, default=0))
    return keep, parents


def acceptance_walk(rows: Tensor, n_rows: Tensor, conf: Tensor, tok: Tensor, info: Tensor,
                    rules: StepRules) -> tuple[Tensor, Tensor, Tensor]:
    """Spiffy's walk (``decoder`` module docstring) over one call's rows [N, B] (``n_rows`` real) and
    their ``conf``/``tok`` [N, B]: ``Y = commit(X, L[0])``; while Y is unfinished and a draft row equals
    Y, accept it and commit with its logits. Returns (the new main state, the row whose logits produced
    it, rows accepted).

    All rows at once: every row's own commit ``Z[r]``, and the walk's next row after r, the draft row
    equal to ``Z[r]`` when ``Z[r]`` is unfinished (real drafts are distinct, and a padding row, the main
    state, never equals a commit of it). The walk follows these links from row 0; pointer doubling
    reaches its end, and counts its hops, in log2(N) gathers."""
    n = rows.shape[0]
    z = commit_rule(rows, conf, tok, rules)
    if n == 1:
        return z[0], torch.zeros_like(n_rows), torch.zeros_like(n_rows)
    index = torch.arange(n, device=rows.device)
    draft = (index >= 1) & (index < n_rows)
    equal = (z[:, None, :] == rows[None, :, :]).all(-1) & draft[None] & ~finished(z, info, rules)[:, None]
    has_next = equal.any(-1)
    link = torch.where(has_next, equal.long().argmax(-1), index)  # the end of the walk links to itself
    hops = has_next.long()
    for _ in range((n - 1).bit_length()):  # after k rounds: 2**k hops followed, at most N - 1 exist
        hops = hops + hops[link]
        link = link[link]
    end = link[:1]
    return z.index_select(0, end)[0], end[0], hops[0]


def decode_step(logits: Tensor, rows: Tensor, parents: Tensor, n_rows: Tensor, info: Tensor, rules: StepRules,
                tables: DraftTables | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The bookkeeping of one call: its ``logits`` [N, B, V], ``rows`` [N, B], ``parents`` [N], real rows
    ``n_rows`` (int64 []) and the block's ``info`` [start, need] -> the next call's rows [1 + D, B] (row 0
    the new main state), parents [1 + D], real rows (int64 []) and this step's status word (int64
    [len(STATUS_FIELDS) + N]: ``STATUS_FIELDS`` then the call's parents). ``tables`` None or a zero
    budget: vanilla, no drafts."""
    conf, tok = confidence(logits, rules.mask_id, rules.confidence_dtype, rules.argmax_of_probs)
    return step_from_confidences(conf, tok, rows, parents, n_rows, info, rules, tables)


def step_from_confidences(conf: Tensor, tok: Tensor, rows: Tensor, parents: Tensor, n_rows: Tensor, info: Tensor,
                          rules: StepRules, tables: DraftTables | None, order: bool = False) -> tuple[Tensor, ...]:
    """``decode_step`` after ``confidence``: ``conf``/``tok`` [N, B] instead of the logits. Integer and
    boolean work plus the drafts' float64 scores: what ``device_loop`` may compile (the confidences stay
    the Python loop's own function, so the commits see the same values). ``order``: a fifth output, int64
    [1 + D, 2], ``draft_rows``' order of the next call's rows (row 0 the main state: -1, 0)."""
    y, cur, accepted = acceptance_walk(rows, n_rows, conf, tok, info, rules)
    stalled = (y == rows[0]).all()
    done = finished(y, info, rules)
    head = torch.full((1,), -1, dtype=torch.long, device=rows.device)
    main_order = torch.cat([head, torch.zeros_like(head)])[None]  # [[-1, 0]], no host data (no copy to wait for)
    if tables is None or rules.draft_budget == 0:
        next_rows, next_parents, kept, next_order = y[None], head, torch.zeros_like(n_rows), main_order
    else:
        d_rows, d_parents, kept, *d_order = draft_rows(y, _row(conf, cur), _row(tok, cur), info, rules, tables, order)
        next_rows, next_parents = torch.cat([y[None], d_rows]), torch.cat([head, d_parents])
        next_order = torch.cat([main_order] + d_order) if order else main_order
    guess = _row(tok, cur)[0]
    masked = (y == rules.mask_id).sum()
    status = torch.cat([torch.stack([done.long(), accepted, stalled.long(), n_rows.long(), guess.long(),
                                     masked.long()]), parents])
    return (next_rows, next_parents, 1 + kept, status) + ((next_order,) if order else ())


class CompiledStep:
    """``fn`` (bookkeeping: a few hundred small tensor ops) through ``torch.compile`` with static shapes
    and no graph break, which fuses them into a few dozen kernels; ``backend`` None or False: ``fn`` itself.
    A compile that fails falls back to ``fn`` (the same ops, eager) with one warning, the reason kept in
    ``compile_error``. Each new shape compiles again, so callers pad shapes to a few buckets."""

    def __init__(self, fn, backend: str | bool | None = "inductor"):
        self.fn, self.compile_error = fn, None
        if backend in (None, False):
            self.compiled = None
            return
        self.compiled = torch.compile(fn, backend="inductor" if backend is True else backend, fullgraph=True,
                                      dynamic=False)
        config = torch._dynamo.config
        if config.recompile_limit < STEP_RECOMPILE_LIMIT:
            log.info("specfold: raising torch._dynamo.config.recompile_limit from %d to %d (a compiled decode "
                     "step keeps a graph a padded shape)", config.recompile_limit, STEP_RECOMPILE_LIMIT)
            config.recompile_limit = STEP_RECOMPILE_LIMIT

    def __call__(self, *args):
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as exc:  # noqa: BLE001 - any compile failure: the same ops, eager
                self.compile_error, self.compiled = f"{type(exc).__name__}: {exc}"[:500], None
                warnings.warn(f"device loop: the step's bookkeeping runs eagerly, its compile failed "
                              f"({self.compile_error.splitlines()[0]})", stacklevel=2)
        return self.fn(*args)
