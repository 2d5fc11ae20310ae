"""``decoding.device_step``: each piece of a step's bookkeeping against its Python reference (commit.py,
graph.py) on random states, confidences and draft graphs; and that a step reads nothing back to the host."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfold_compile.decoding import (block_finished, build_drafts, commit, default_draft_graph, load_draft_graph,
                                       rank_masked_positions)
from specfold_compile.decoding.device_step import (STATUS_FIELDS, DraftTables, StepRules, acceptance_walk,
                                                   commit_rule, decode_step, draft_rows, finished,
                                                   prefix_of_drafts, rank_of_positions, threshold_in)
from specfold_compile.testing import no_host_reads

MASK, EOS = 15, 1
HSET = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def draft_graphs(draw, block: int):
    """The built-in graph, or random nodes: level 1 any rank set, level k a level k-1 node's set plus ranks
    (so every node has a parent)."""
    if draw(st.booleans()):
        return load_draft_graph(default_draft_graph(block, draw(st.integers(1, 4)), draw(st.integers(1, 4))), block)
    ranks = st.integers(1, block - 1)
    levels = [[frozenset(draw(st.lists(ranks, min_size=1, max_size=3)))]]
    for k in range(2, draw(st.integers(1, 4)) + 1):
        level = []
        for _ in range(draw(st.integers(1, 3))):
            base = draw(st.sampled_from(levels[-1]))
            grown = base | frozenset(draw(st.lists(ranks, min_size=1, max_size=3)))
            if len(grown) > len(base) and len(grown) >= k:
                level.append(grown)
        if not level:
            break
        levels.append(level)
    nodes = {(k + 1, s) for k, level in enumerate(levels) for s in level}
    return load_draft_graph({"version": 1, "block_size": block,
                             "nodes": [{"level": k, "ranks": sorted(s)} for k, s in sorted(nodes, key=lambda n: (n[0], sorted(n[1])))]},
                            block)


@st.composite
def step_cases(draw):
    """A block state with masks, confidences (with ties: quantised, or bf16), tokens, a block's counted
    positions, rules and a draft graph."""
    block = draw(st.sampled_from([8, 16]))
    sub = draw(st.sampled_from([None, 4]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    state = torch.randint(0, MASK, (block,), generator=g)
    masked = torch.randperm(block, generator=g)[:draw(st.integers(1, block - 1))]
    state[masked] = MASK
    conf = torch.rand(block, generator=g)
    kind = draw(st.sampled_from(["float32", "quantised", "bfloat16", "float16", "ones"]))
    if kind == "quantised":
        conf = (conf * 4).round() / 4
    elif kind in ("bfloat16", "float16"):
        conf = conf.to(getattr(torch, kind))
    elif kind == "ones":
        conf = torch.where(conf > 0.5, 1.0, conf)
    tok = torch.randint(0, MASK, (block,), generator=g)
    start = draw(st.integers(0, 3))
    need = draw(st.integers(1, block - start))
    rules = StepRules(block, sub, MASK, draw(st.sampled_from([EOS, None])), draw(st.sampled_from([0.5, 0.9, 1.0])),
                      draw(st.booleans()), "float32", False, draw(st.integers(1, 9)))
    return state, conf, tok, start, need, rules, draw(draft_graphs(block))


@settings(max_examples=60, **HSET)
@given(step_cases())
def test_pieces_match_the_python_rules(case):
    state, conf, tok, start, need, rules, graph = case
    info = torch.tensor([start, need])

    def fin(s):
        return block_finished(s, MASK, need, rules.eos_id, start)

    assert bool(finished(state, info, rules)) == fin(state)
    assert torch.equal(commit_rule(state, conf, tok, rules),
                       commit(state, conf, tok, MASK, rules.sub_block_size, rules.threshold, rules.inclusive))
    rank = rank_of_positions(state, conf, rules)
    order = rank_masked_positions(state, conf, MASK, rules.sub_block_size)
    assert [int(rank[p]) for p in order] == list(range(1, len(order) + 1))
    assert bool((rank[state != MASK] > len(order)).all())

    ref = build_drafts(state, conf, tok, graph, MASK, rules.sub_block_size, rules.draft_budget, fin)
    rows, parents, kept = draft_rows(state, conf, tok, info, rules, DraftTables.from_graph(graph))
    k = len(ref.states)
    assert int(kept) == k
    assert rows.shape == (rules.draft_budget, rules.block_size) and parents.shape == (rules.draft_budget,)
    assert rows[:k].tolist() == [s.tolist() for s in ref.states]
    assert parents[:k].tolist() == ref.parents
    assert bool((rows[k:] == state).all()) and bool((parents[k:] == 0).all())  # padding: copies of the main row

    # a smaller budget keeps a prefix of the greedy choice: build_drafts with it, from the order
    *same, order = draft_rows(state, conf, tok, info, rules, DraftTables.from_graph(graph), order=True)
    assert all(torch.equal(a, b) for a, b in zip(same, (rows, parents, kept)))
    assert sorted(order[:k, 0].tolist()) == list(range(k))
    assert bool((order[k:] == torch.tensor([rules.draft_budget, 0])).all())  # padding rows: never picked
    for budget in range(k + 1):
        keep, kept_parents = prefix_of_drafts(order[:k, 1].tolist(), order[:k, 0].tolist(), budget)
        smaller = build_drafts(state, conf, tok, graph, MASK, rules.sub_block_size, budget, fin)
        assert [rows[j].tolist() for j in keep] == [s.tolist() for s in smaller.states]
        assert kept_parents == smaller.parents


@settings(max_examples=200, **HSET)
@given(st.floats(0.0, 1.0, exclude_min=True), st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
def test_threshold_in_a_dtype_is_the_cast_of_a_comparison(threshold, dtype):
    """bf16 / fp16: the threshold as the tensor comparison casts it; float32 compares as it is."""
    rounded = threshold_in(dtype, threshold)
    assert rounded == (threshold if dtype == torch.float32 else float(torch.tensor(threshold, dtype=dtype)))
    values = (torch.tensor(threshold, dtype=dtype) + torch.arange(-3, 4) * torch.finfo(dtype).eps).to(dtype)
    upcast = values.float()
    assert torch.equal(values > threshold, upcast > rounded) and torch.equal(values >= threshold, upcast >= rounded)


def test_draft_tables_of_the_shipped_graph():
    from specfold_compile.loading import DEFAULT_MODEL_DIR

    graph = load_draft_graph(DEFAULT_MODEL_DIR / "draft_graph.json", 32)
    t = DraftTables.from_graph(graph)
    assert t.ranks.shape == (len(graph), 33) and t.parents.shape == (len(graph), len(graph))
    for j, ((_, s), ps) in enumerate(zip(graph.nodes, graph.parents)):
        assert set(t.ranks[j].nonzero().flatten().tolist()) == set(s)
        assert set(t.parents[j].nonzero().flatten().tolist()) == set(ps)
        assert bool(t.level1[j]) == (not ps)
    assert 1 <= t.depth <= len(graph)


# --- no host reads (testing.no_host_reads) ---------------------------------------------------------

def test_the_guard_catches_host_reads():
    x = torch.arange(6)
    for read in (lambda: x.tolist(), lambda: x[2].item(), lambda: bool(x[1]), lambda: x.nonzero(),
                 lambda: x[x > 2], lambda: x[torch.tensor(1)], lambda: int(x.sum())):
        with pytest.raises(AssertionError, match="host read"), no_host_reads():
            read()


@pytest.mark.parametrize("budget", [0, 5])
@pytest.mark.parametrize("sub", [None, 4])
def test_a_step_reads_nothing_back(budget, sub):
    """``decode_step`` on a call of 1 and of 1 + budget rows runs under guards that fail on any host read."""
    block, vocab = 8, 16
    graph = load_draft_graph(default_draft_graph(block), block)
    rules = StepRules(block, sub, MASK, EOS, 0.9, False, "model", True, budget)
    tables = DraftTables.from_graph(graph) if budget else None
    g = torch.Generator().manual_seed(3)
    state = torch.full((block,), MASK)
    state[0] = 4
    info = torch.tensor([0, block])
    rows = state[None]
    parents = torch.tensor([-1])
    n_rows = torch.tensor(1)
    for _ in range(3):
        logits = torch.randn(rows.shape[0], block, vocab, generator=g) * 4
        with no_host_reads():
            rows, parents, n_rows, status = decode_step(logits, rows, parents, n_rows, info, rules, tables)
        assert rows.shape == (1 + budget, block) and parents.shape == (1 + budget,)
        assert status.shape[0] == len(STATUS_FIELDS) + logits.shape[0]
        assert int(parents[0]) == -1 and 1 <= int(n_rows) <= 1 + budget


@settings(max_examples=40, **HSET)
@given(step_cases(), st.integers(0, 2**31), st.integers(1, 6))
def test_acceptance_walk_matches_the_python_walk(case, seed, chain):
    """Rows holding a chain of commits (in shuffled order) among random ones: the walk follows it as far
    as the Python loop's walk does."""
    state, _, _, start, need, rules, _ = case
    g = torch.Generator().manual_seed(seed)
    info = torch.tensor([start, need])
    n = 1 + chain + 2
    conf = torch.rand(n, rules.block_size, generator=g)
    tok = torch.randint(0, MASK, (n, rules.block_size), generator=g)
    rows = [state]
    for _ in range(chain):  # each row the previous one's commit: unless finished, the walk accepts it
        rows.append(commit(rows[-1], conf[len(rows) - 1], tok[len(rows) - 1], MASK, rules.sub_block_size,
                           rules.threshold, rules.inclusive))
    rows += [torch.randint(0, MASK + 1, (rules.block_size,), generator=g) for _ in range(2)]
    order = [0] + (1 + torch.randperm(n - 1, generator=g)).tolist()
    rows_t, conf, tok = torch.stack([rows[i] for i in order]), conf[order], tok[order]
    distinct = {tuple(r.tolist()) for r in rows_t[1:]}
    if len(distinct) < n - 1 or tuple(state.tolist()) in distinct:
        return  # the loop's draft rows are distinct and never the main state
    y, cur, accepted = commit(state, conf[0], tok[0], MASK, rules.sub_block_size, rules.threshold,
                              rules.inclusive), 0, 0
    row_of = {tuple(r): i for i, r in enumerate(rows_t.tolist()) if i > 0}
    while not block_finished(y, MASK, need, rules.eos_id, start):
        r = row_of.pop(tuple(y.tolist()), None)
        if r is None:
            break
        cur, accepted = r, accepted + 1
        y = commit(y, conf[r], tok[r], MASK, rules.sub_block_size, rules.threshold, rules.inclusive)
    got = acceptance_walk(rows_t, torch.tensor(n), conf, tok, info, rules)
    assert got[0].tolist() == y.tolist() and int(got[1]) == cur and int(got[2]) == accepted
