"""Spiffy draft graphs: file format, validation, the built-in default, and run-time drafting + pruning.

A draft node ``(level k >= 1, ranks S)`` stands for "the next main state X' with argmax(L) committed at
the masked positions of X' whose confidence rank (see ``commit.rank_masked_positions``) is in S".
Node ``(k, S)`` is a child of ``(k-1, S')`` when ``S'`` is a strict subset of ``S``; level-1 nodes are
children of the root (X' itself). A node may have several parents (DAG).

File format (JSON)::

    {"version": 1, "block_size": B, "max_rank": r,
     "nodes": [{"level": k, "ranks": [..]}, ...]}          # optional per node: "parents": [indices]

Without ``"parents"`` the parents of a node are all listed nodes one level up whose rank set is a strict
subset of its own. With ``"parents"`` (indices into ``nodes``) each listed parent must be such a node.
Ranks are 1-based and lie in ``1..block_size-1`` (position 0 of a block is always the committed seed).
"""

from __future__ import annotations

import functools
import heapq
import json
import math
import os
from dataclasses import dataclass, field

import torch

from .. import json_input
from .commit import rank_masked_positions

__all__ = [
    "DraftGraph",
    "load_draft_graph",
    "save_draft_graph",
    "default_draft_graph",
    "default_graph",
    "build_drafts",
    "prune_nodes",
]

GRAPH_VERSION = 1


@dataclass(frozen=True)
class DraftGraph:
    """A validated draft graph. ``nodes[i] = (level, ranks)`` in topological order (by level);
    ``parents[i]`` = tuple of node indices (empty for level 1: parent is the root)."""

    block_size: int
    max_rank: int
    nodes: tuple[tuple[int, frozenset[int]], ...]
    parents: tuple[tuple[int, ...], ...]
    children: tuple[tuple[int, ...], ...] = field(default=())

    def __len__(self) -> int:
        return len(self.nodes)

    def to_dict(self) -> dict:
        return {
            "version": GRAPH_VERSION,
            "block_size": self.block_size,
            "max_rank": self.max_rank,
            "nodes": [
                {"level": k, "ranks": sorted(s), "parents": list(p)}
                for (k, s), p in zip(self.nodes, self.parents)
            ],
        }


def _err(msg: str) -> ValueError:
    return ValueError(f"draft_graph: {msg}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@functools.lru_cache(maxsize=64)
def _validated(graph: DraftGraph, block_size: int) -> DraftGraph:
    """``load_draft_graph`` of a ``DraftGraph``, which depends on its value only: validated once per value
    (``generate`` gets the same graph on every call of a serving loop)."""
    return load_draft_graph(graph.to_dict(), block_size)


def _file_stamp(path) -> tuple[int, int] | None:
    """(modification time in ns, size) of a draft graph's file, or None where it cannot be read (the
    uncached path then raises its error)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=16)
def _loaded_file(path: str, block_size: int, mtime_ns: int, size: int) -> DraftGraph:
    """``load_draft_graph`` of a file, read and validated once per path, block size and version of the
    file (its modification time and size): a serving loop passes the same path on every call."""
    return load_draft_graph(json_input.load_file(path, "draft_graph: file"), block_size)  # a non-dict: its error


def load_draft_graph(graph, block_size: int) -> DraftGraph:
    """Validate a draft graph given as a path (str / PathLike, JSON), a dict, or a ``DraftGraph``.

    Raises ``ValueError`` naming the problem: unreadable / non-JSON / absurdly nested file, wrong version, block size that
    differs from ``block_size``, ranks outside ``1..block_size-1`` or above ``max_rank``, empty or
    duplicate rank lists, duplicate nodes, a level-k node with no possible parent, bad parent lists.
    Nodes are re-ordered by level (stable), parent indices remapped accordingly.
    """
    if not _is_int(block_size) or block_size < 2:
        raise ValueError(f"block_size must be an int >= 2, got {block_size!r}")
    if isinstance(graph, DraftGraph):
        return _validated(graph, block_size)
    if isinstance(graph, (str, os.PathLike)):
        stamp = _file_stamp(graph)
        if stamp is not None:
            return _loaded_file(os.fspath(graph), block_size, *stamp)
        # json_input refuses absurd nesting up front (Python's parser would raise RecursionError)
        graph = json_input.load_file(graph, "draft_graph: file")
    if not isinstance(graph, dict):
        raise _err(f"expected a dict, a path or a DraftGraph, got {type(graph).__name__}")
    if graph.get("version") != GRAPH_VERSION:
        raise _err(f"unsupported version {graph.get('version')!r} (expected {GRAPH_VERSION})")
    gb = graph.get("block_size", block_size)
    if not _is_int(gb) or gb != block_size:
        raise _err(f"block_size {gb!r} does not fit the model's block size {block_size}")
    nodes_in = graph.get("nodes")
    if not isinstance(nodes_in, list):
        raise _err("'nodes' must be a list")
    max_rank = graph.get("max_rank", block_size - 1)
    if not _is_int(max_rank) or not 1 <= max_rank <= block_size - 1:
        raise _err(f"max_rank {max_rank!r} outside 1..{block_size - 1}")

    raw = []
    seen = set()
    for i, nd in enumerate(nodes_in):
        if not isinstance(nd, dict):
            raise _err(f"node {i} is not an object")
        k = nd.get("level")
        if not _is_int(k) or k < 1:
            raise _err(f"node {i}: level {k!r} is not an int >= 1")
        ranks = nd.get("ranks")
        if not isinstance(ranks, (list, tuple)) or len(ranks) == 0:
            raise _err(f"node {i}: 'ranks' must be a non-empty list")
        for r in ranks:
            if not _is_int(r):
                raise _err(f"node {i}: rank {r!r} is not an int")
            if not 1 <= r <= block_size - 1:
                raise _err(f"node {i}: rank {r} outside 1..{block_size - 1}")
            if r > max_rank:
                raise _err(f"node {i}: rank {r} above max_rank {max_rank}")
        s = frozenset(ranks)
        if len(s) != len(ranks):
            raise _err(f"node {i}: duplicate ranks {list(ranks)}")
        if len(s) < k:
            raise _err(f"node {i}: a level-{k} node needs at least {k} ranks (one per step), got {len(s)}")
        if (k, s) in seen:
            raise _err(f"node {i}: duplicate node (level {k}, ranks {sorted(s)})")
        seen.add((k, s))
        par = nd.get("parents")
        if par is not None:
            if not isinstance(par, (list, tuple)) or not all(_is_int(p) for p in par):
                raise _err(f"node {i}: 'parents' must be a list of node indices")
        raw.append((k, s, par))

    order = sorted(range(len(raw)), key=lambda i: raw[i][0])  # stable: by level
    new_index = {old: new for new, old in enumerate(order)}
    nodes = tuple((raw[i][0], raw[i][1]) for i in order)
    by_level: dict[int, list[int]] = {}
    for j, (k, _) in enumerate(nodes):
        by_level.setdefault(k, []).append(j)

    parents = []
    for j, old in enumerate(order):
        k, s, par = raw[old]
        if par is None:
            if k == 1:
                ps = ()
            else:
                ps = tuple(q for q in by_level.get(k - 1, []) if nodes[q][1] < s)
                if not ps:
                    raise _err(f"node {old} (level {k}, ranks {sorted(s)}) has no possible parent: "
                               f"no level-{k - 1} node with a strict subset of its ranks")
        else:
            if k == 1:
                if len(par) != 0:
                    raise _err(f"node {old}: a level-1 node's parent is the root; 'parents' must be empty")
                ps = ()
            else:
                if len(par) == 0:
                    raise _err(f"node {old} (level {k}) has no parent")
                ps_l = []
                for p in par:
                    if not 0 <= p < len(raw):
                        raise _err(f"node {old}: parent index {p} out of range")
                    pk, pset, _ = raw[p]
                    if pk != k - 1 or not pset < s:
                        raise _err(f"node {old}: node {p} (level {pk}, ranks {sorted(pset)}) cannot be "
                                   f"its parent (needs level {k - 1} and a strict subset of its ranks)")
                    ps_l.append(new_index[p])
                ps = tuple(sorted(set(ps_l)))
        parents.append(ps)

    children = [[] for _ in nodes]
    for j, ps in enumerate(parents):
        for p in ps:
            children[p].append(j)
    return DraftGraph(block_size=block_size, max_rank=max_rank, nodes=nodes,
                      parents=tuple(parents), children=tuple(tuple(c) for c in children))


def save_draft_graph(graph, path) -> None:
    """Write a graph (dict or DraftGraph) as JSON. Dicts are written as given (after validation)."""
    if isinstance(graph, DraftGraph):
        d = graph.to_dict()
    elif isinstance(graph, dict):
        d = graph
        if not _is_int(d.get("block_size")):
            raise _err("a graph dict to save needs an int 'block_size'")
        load_draft_graph(d, d["block_size"])
    else:
        raise TypeError(f"graph must be a dict or DraftGraph, got {type(graph).__name__}")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(d, f, indent=1)
        f.write("\n")


@functools.lru_cache(maxsize=8)
def default_graph(block_size: int) -> DraftGraph:
    """``default_draft_graph(block_size)`` validated, once per block size (what ``generate`` decodes with
    when given no graph)."""
    return load_draft_graph(default_draft_graph(block_size), block_size)


def default_draft_graph(block_size: int, max_level: int = 4, width: int = 4) -> dict:
    """Built-in graph used when ``draft_graph`` is None: rank-prefix chains.

    Level ``k`` holds the nodes ``{1..n}`` for ``k <= n <= k + width - 1`` (ranks capped at
    ``block_size - 1``): "the next ``k`` steps commit the ``n`` most confident masked positions". These
    are the commits a threshold rule makes when confidence ranks are stable, which is the common case;
    a calibrated graph (``calibrate``) replaces it for real models.
    """
    top = block_size - 1
    nodes = []
    for k in range(1, max_level + 1):
        for n in range(k, min(k + width - 1, top) + 1):
            nodes.append({"level": k, "ranks": list(range(1, n + 1))})
    return {"version": GRAPH_VERSION, "block_size": block_size,
            "max_rank": min(max_level + width - 1, top), "nodes": nodes}


# ----------------------------------------------------------------------------------------------------
# run time: instantiate the graph on a state, prune, build rows


def prune_nodes(scores: list[float], parents: list[tuple[int, ...]], budget: int) -> list[int]:
    """Choose ``min(budget, len(scores))`` nodes forming an ancestor-closed set: every chosen node is a
    child of the root or has at least one chosen parent, so it is reachable from the root.

    ``parents[i]`` holds node indices < i (topological order) and ``-1`` for the root; an empty tuple
    also means "child of the root". Each node's value is its subtree
    accumulation ``t(i) = scores[i] * (1 + sum_{children c} t(c))`` (expected number of accepted rows
    below and at i when ``scores`` are acceptance probabilities); nodes are taken greedily by highest
    ``t`` among the currently reachable ones (ties: lower index). Returns the chosen indices, ascending.
    """
    n = len(scores)
    if budget <= 0 or n == 0:
        return []
    children = [[] for _ in range(n)]
    for i, ps in enumerate(parents):
        for p in ps:
            if p >= 0:
                children[p].append(i)
    t = [0.0] * n
    for i in range(n - 1, -1, -1):
        t[i] = scores[i] * (1.0 + sum(t[c] for c in children[i]))
    # the reachable nodes in a heap by (-t, index): the greedy's next pick is its smallest entry (a node
    # reached through several parents is pushed once per parent and skipped once chosen)
    frontier = [(-t[i], i) for i in range(n) if not parents[i] or -1 in parents[i]]
    heapq.heapify(frontier)
    chosen: set[int] = set()
    while frontier and len(chosen) < budget:
        _, best = heapq.heappop(frontier)
        if best in chosen:
            continue
        chosen.add(best)
        for c in children[best]:
            if c not in chosen:
                heapq.heappush(frontier, (-t[c], c))
    return sorted(chosen)


@dataclass
class Drafts:
    """Draft rows for one verification call (row 0, the main state, is not included)."""

    states: list[torch.Tensor]          # [B] int64 each
    parents: list[int]                  # fold parent row (0 = main) for each draft, in row numbering
    keys: list[tuple[int, ...]]         # rank sets (sorted), for stats / debugging


@functools.lru_cache(maxsize=256)
def _candidates(graph: DraftGraph, m: int) -> tuple[tuple, tuple, tuple, tuple]:
    """What ``build_drafts`` makes of ``graph`` on a state of ``m`` masked positions, which depends on
    nothing else (so once per graph and ``m``): its distinct drafts in topological order (by rank count,
    then first appearance), each one's ranks less one (as its effective set iterates them, which fixes
    the order of its score's sum), its ranks sorted (the draft's key), and its parents among the drafts
    (candidate indices, sorted; ``-1``: the root). A node's effective ranks are those that exist
    (<= ``m``); nodes with the same effective ranks merge; a node with none is the root, and one with all
    ``m`` a finished block, never verified (its descendants are supersets: finished too)."""
    cand_of_key: dict[frozenset, int] = {}
    keys: list[frozenset] = []
    parents: list[set] = []
    node_cand: list = []  # node -> candidate id (-1 the root, None dropped)
    for j, (_, s) in enumerate(graph.nodes):
        eff = frozenset(r for r in s if r <= m)
        if not eff:
            node_cand.append(-1)
            continue
        if len(eff) == m:
            node_cand.append(None)
            continue
        c = cand_of_key.get(eff)
        if c is None:
            c = len(keys)
            cand_of_key[eff] = c
            keys.append(eff)
            parents.append(set())
        node_cand.append(c)
        for p in graph.parents[j]:
            if node_cand[p] is not None and node_cand[p] != c:
                parents[c].add(node_cand[p])
        if not graph.parents[j]:
            parents[c].add(-1)
    topo = sorted(range(len(keys)), key=lambda c: (len(keys[c]), c))
    return (tuple(topo), tuple(tuple(r - 1 for r in k) for k in keys), tuple(tuple(sorted(k)) for k in keys),
            tuple(tuple(sorted(p)) for p in parents))


def build_drafts(root: torch.Tensor, conf: torch.Tensor, tok: torch.Tensor, graph: DraftGraph,
                 mask_id: int, sub_block_size: int | None, budget: int,
                 is_finished=None) -> Drafts:
    """Instantiate ``graph`` on the main state ``root`` (= X') using the previous logits' ``(conf, tok)``
    (= L), drop useless drafts, prune to ``budget`` and return rows in topological order.

    A node's effective rank set is its ranks that exist (<= number of masked positions). Nodes with the
    same effective set are the same state and merge into one draft; drafts equal to the root, or
    finished (``is_finished(state)``, the state as a list of ints, e.g. complete: their logits are never
    needed), are dropped, and their children re-attach to the surviving ancestors (a dropped root-equal
    parent means the root).
    Score = geometric mean of ``conf`` over the draft's tokens. Fold parent = first parent in row order.
    """
    # plain lists: one call builds a state for every graph node, tensors only for the kept rows
    root_list, conf_list = root.tolist(), conf.tolist()
    order = rank_masked_positions(root_list, conf_list, mask_id, sub_block_size)
    m = len(order)
    if budget <= 0 or m == 0 or len(graph) == 0:
        return Drafts([], [], [])
    topo, ranks, keys, cand_parents = _candidates(graph, m)
    tok_list = tok.tolist()
    tok_at = [tok_list[p] for p in order]  # by rank - 1, as the candidates' ranks index them
    logc_at = [math.log(max(conf_list[p], 1e-30)) for p in order]

    # states, finished ones dropped (a finished draft's descendants are finished too: supersets)
    idx, states = [], {}
    for c in topo:
        st = list(root_list)
        for r in ranks[c]:
            st[order[r]] = tok_at[r]
        if is_finished is None or not is_finished(st):
            idx.append(c)
            states[c] = st
    pos_of = {c: i for i, c in enumerate(idx)}
    scores, parents = [], []
    for c in idx:
        scores.append(math.exp(sum(map(logc_at.__getitem__, ranks[c])) / len(ranks[c])))
        ps = sorted(pos_of[p] for p in cand_parents[c] if p != -1 and p in pos_of)
        if -1 in cand_parents[c]:
            ps.insert(0, -1)
        # (all parents dropped cannot happen: a dropped parent is finished, hence so is c)
        parents.append(tuple(ps))
    keep = prune_nodes(scores, parents, budget)
    row_of = {i: r + 1 for r, i in enumerate(keep)}  # candidate position -> row number
    out_parents, out_keys = [], []
    for i in keep:
        ps = [0 if p == -1 else row_of[p] for p in parents[i] if p == -1 or p in row_of]
        out_parents.append(min(ps) if ps else 0)
        out_keys.append(keys[idx[i]])
    # one tensor for all kept rows (one torch.tensor call, not one per row), handed out as its rows
    kept = torch.tensor([states[idx[i]] for i in keep], dtype=root.dtype).reshape(len(keep), root.numel())
    return Drafts(list(kept.unbind(0)), out_parents, out_keys)
