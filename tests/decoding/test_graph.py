import json
import os

import pytest
import torch
from hypothesis import given, settings, strategies as hs

from specfold_compile.decoding import (
    DraftGraph, build_drafts, default_draft_graph, load_draft_graph, prune_nodes, save_draft_graph,
)
from specfold_compile.decoding.graph import default_graph


@pytest.mark.parametrize("B", [2, 4, 8, 16, 32])
def test_default_graph_valid(B):
    g = load_draft_graph(default_draft_graph(B), B)
    assert isinstance(g, DraftGraph) and len(g) > 0
    for (k, s), ps in zip(g.nodes, g.parents):
        assert all(1 <= r <= B - 1 for r in s)
        assert (k == 1) == (len(ps) == 0)


def test_round_trip(tmp_path):
    d = default_draft_graph(16)
    g = load_draft_graph(d, 16)
    p = tmp_path / "g.json"
    save_draft_graph(g, p)
    g2 = load_draft_graph(str(p), 16)
    assert g2 == g
    save_draft_graph(d, tmp_path / "d.json")
    assert load_draft_graph(tmp_path / "d.json", 16) == g
    assert load_draft_graph(g, 16) == g


def test_a_draft_graph_is_validated_once_per_value():
    g = load_draft_graph(default_draft_graph(16), 16)
    again = load_draft_graph(DraftGraph(g.block_size, g.max_rank, g.nodes, g.parents, g.children), 16)
    assert again is load_draft_graph(g, 16)  # equal values: the first validation's result
    with pytest.raises(ValueError, match="block_size 16 does not fit"):
        load_draft_graph(g, 8)
    bad = DraftGraph(16, 3, ((1, frozenset({5})),), ((),), ((),))  # rank 5 above max_rank 3
    for _ in range(2):  # a failed validation is not remembered
        with pytest.raises(ValueError, match="draft_graph"):
            load_draft_graph(bad, 16)


def test_a_graph_file_is_read_once_per_version(tmp_path):
    p = tmp_path / "g.json"
    save_draft_graph(default_draft_graph(16), p)
    first = load_draft_graph(p, 16)
    assert load_draft_graph(str(p), 16) is first  # the same file unchanged: the first load's result
    smaller = load_draft_graph({**default_draft_graph(16), "nodes": default_draft_graph(16)["nodes"][:2]}, 16)
    save_draft_graph(smaller, p)
    os.utime(p, ns=(1, 1))  # a new version, whatever the file system's time resolution
    assert load_draft_graph(p, 16) == smaller != first
    p.write_text("{not json")
    for _ in range(2):  # a failed load is not remembered
        with pytest.raises(ValueError, match="not valid JSON"):
            load_draft_graph(p, 16)


def test_default_graph_is_the_default_draft_graph_validated_once():
    assert default_graph(16) == load_draft_graph(default_draft_graph(16), 16)
    assert default_graph(16) is default_graph(16)


def test_listed_parents_and_dag():
    d = {"version": 1, "block_size": 8, "max_rank": 4, "nodes": [
        {"level": 2, "ranks": [1, 2, 3], "parents": [1, 2]},
        {"level": 1, "ranks": [1]},
        {"level": 1, "ranks": [1, 2]},
        {"level": 1, "ranks": [2]},
    ]}
    g = load_draft_graph(d, 8)
    assert g.nodes[3] == (2, frozenset({1, 2, 3}))
    assert g.parents[3] == (0, 1)
    d["nodes"][0].pop("parents")  # derived: all level-1 strict subsets
    assert load_draft_graph(d, 8).parents[3] == (0, 1, 2)


def _g(nodes, **kw):
    d = {"version": 1, "block_size": 8, "nodes": nodes}
    d.update(kw)
    return d


BAD = [
    ([1, 2], "expected a dict"),
    (_g([], version=2), "version"),
    (_g([], block_size=16), "block_size"),
    (_g("x"), "'nodes'"),
    (_g([{"level": 1, "ranks": [8]}]), "rank 8 outside 1..7"),
    (_g([{"level": 1, "ranks": [0]}]), "outside"),
    (_g([{"level": 1, "ranks": []}]), "non-empty"),
    (_g([{"level": 1, "ranks": [1, 1]}]), "duplicate ranks"),
    (_g([{"level": 0, "ranks": [1]}]), "level"),
    (_g([{"level": 1, "ranks": [1.5]}]), "not an int"),
    (_g([{"level": 1, "ranks": [1]}, {"level": 1, "ranks": [1]}]), "duplicate node"),
    (_g([{"level": 2, "ranks": [1, 2]}]), "no possible parent"),
    (_g([{"level": 1, "ranks": [2]}, {"level": 2, "ranks": [1, 3]}]), "no possible parent"),
    (_g([{"level": 1, "ranks": [1]}, {"level": 3, "ranks": [1, 2, 3]}]), "no possible parent"),
    (_g([{"level": 2, "ranks": [1]}]), "at least 2 ranks"),
    (_g([{"level": 1, "ranks": [5]}], max_rank=4), "max_rank"),
    (_g([{"level": 1, "ranks": [1]}, {"level": 2, "ranks": [1, 2], "parents": [5]}]), "out of range"),
    (_g([{"level": 1, "ranks": [3]}, {"level": 2, "ranks": [1, 2], "parents": [0]}]), "cannot be"),
    (_g([{"level": 1, "ranks": [1], "parents": [0]}]), "root"),
    (_g(["x"]), "not an object"),
]


@pytest.mark.parametrize("graph,msg", BAD)
def test_bad_graphs(graph, msg):
    with pytest.raises(ValueError, match=msg):
        load_draft_graph(graph, 8)


def test_bad_files(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_draft_graph(p, 8)
    with pytest.raises(ValueError, match="cannot read"):
        load_draft_graph(tmp_path / "missing.json", 8)
    with pytest.raises(ValueError, match="block size"):
        load_draft_graph(default_draft_graph(32), 16)


def test_deeply_nested_file_is_a_clear_error(tmp_path):
    """Python's JSON parser recurses per level: a hostile file must fail with a ValueError naming the
    draft graph and the depth, not a RecursionError. Brackets inside strings do not count."""
    p = tmp_path / "deep.json"
    p.write_text('{"version": 1, "nodes": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(ValueError, match=r"^draft_graph: file .*deep\.json.*nested 200001 levels deep"):
        load_draft_graph(p, 8)
    p.write_text(json.dumps({**default_draft_graph(8), "note": "[" * 1000}))
    assert len(load_draft_graph(p, 8)) == len(default_draft_graph(8)["nodes"])


@hs.composite
def dags(draw):
    n = draw(hs.integers(0, 25))
    parents = []
    for i in range(n):
        if i == 0 or draw(hs.booleans()):
            ps = (-1,) if draw(hs.booleans()) or i == 0 else ()
        else:
            ps = ()
        extra = draw(hs.sets(hs.integers(0, i - 1), max_size=3)) if i > 0 else set()
        ps = tuple(sorted(set(ps) | extra))
        if not ps:
            ps = (-1,)
        parents.append(ps)
    scores = draw(hs.lists(hs.floats(0, 1), min_size=n, max_size=n))
    return scores, parents


@settings(max_examples=150, deadline=None)
@given(dags(), hs.integers(0, 30))
def test_prune_ancestor_closed(dag, budget):
    scores, parents = dag
    keep = prune_nodes(scores, parents, budget)
    assert len(keep) == min(budget, len(scores)) == len(set(keep))
    ks = set(keep)
    for i in keep:
        assert -1 in parents[i] or any(p in ks for p in parents[i])


def _greedy(scores, parents, budget):
    """prune_nodes by its definition: subtree values, then the best reachable node until the budget."""
    n = len(scores)
    children = {i: [c for c in range(n) if i in parents[c]] for i in range(n)}
    t = {}
    for i in reversed(range(n)):
        t[i] = scores[i] * (1.0 + sum(t[c] for c in children[i]))
    chosen = []
    while len(chosen) < min(budget, n):
        reachable = [i for i in range(n) if i not in chosen
                     and (not parents[i] or -1 in parents[i] or any(p in chosen for p in parents[i]))]
        chosen.append(min(reachable, key=lambda i: (-t[i], i)))
    return sorted(chosen)


@settings(max_examples=150, deadline=None)
@given(dags(), hs.integers(0, 30))
def test_prune_is_the_greedy_by_subtree_value(dag, budget):
    scores, parents = dag
    assert prune_nodes(scores, parents, budget) == _greedy(scores, parents, budget)


def test_prune_prefers_confident():
    # two chains from the root; the confident one is kept first
    scores = [0.1, 0.9, 0.1, 0.9]
    parents = [(-1,), (-1,), (0,), (1,)]
    assert prune_nodes(scores, parents, 2) == [1, 3]
    assert prune_nodes(scores, parents, 0) == []


M = 99


@settings(max_examples=80, deadline=None)
@given(hs.integers(0, 10_000), hs.sampled_from([(8, None), (8, 4), (16, 8), (16, None)]),
       hs.integers(0, 12), hs.integers(1, 6))
def test_build_drafts_rows(seed, shape, budget, n_committed):
    B, sb = shape
    g = torch.Generator().manual_seed(seed)
    root = torch.full((B,), M, dtype=torch.long)
    pos = torch.randperm(B, generator=g)[: min(n_committed, B - 1)]
    root[0] = 3
    root[pos] = 5
    conf = torch.rand(B, generator=g)
    tok = torch.randint(0, 50, (B,), generator=g)
    graph = load_draft_graph(default_draft_graph(B), B)
    d = build_drafts(root, conf, tok, graph, M, sb, budget)
    assert len(d.states) <= budget
    seen = {tuple(root.tolist())}
    rows = [root] + d.states
    for i, (s, p) in enumerate(zip(d.states, d.parents), start=1):
        assert 0 <= p < i
        key = tuple(s.tolist())
        assert key not in seen
        seen.add(key)
        assert bool((s == M).any()), "complete drafts are useless"
        par = rows[p]
        committed_par = par != M
        assert bool((s[committed_par] == par[committed_par]).all())
        assert int((s != M).sum()) > int(committed_par.sum())
        new = (s != root)
        assert bool((s[new] == tok[new]).all()) and bool((root[new] == M).all())
