import torch
from hypothesis import given, strategies as hs

from specfold_compile.decoding import block_finished, commit, rank_masked_positions, window_positions
from specfold_compile.decoding.commit import confidence, next_token, spread_confidences

M = 99  # mask id


def st(*xs):
    return torch.tensor(xs, dtype=torch.long)


def cf(*xs):
    return torch.tensor(xs, dtype=torch.float32)


TOK = torch.arange(10, 18)


def test_threshold_commits_all_above():
    s = st(5, M, M, M, M, M, M, M)
    c = cf(1.0, 0.95, 0.5, 0.91, 0.9, 0.2, 0.99, 0.1)
    out = commit(s, c, TOK, M, None, 0.9)
    assert out.tolist() == [5, 11, M, 13, M, M, 16, M]  # 0.9 is not > 0.9


def test_at_least_one_and_ties_lowest_index():
    s = st(5, M, M, M, M, M, M, M)
    c = cf(1.0, 0.3, 0.6, 0.2, 0.6, 0.1, 0.5, 0.6)
    out = commit(s, c, TOK, M, None, 0.9)
    assert out.tolist() == [5, M, 12, M, M, M, M, M]


def test_committed_positions_ignored():
    s = st(5, 7, M, M, M, M, M, M)
    c = cf(1.0, 0.99, 0.3, 0.2, 0.1, 0.1, 0.1, 0.4)
    out = commit(s, c, TOK, M, None, 0.9)
    assert out.tolist() == [5, 7, M, M, M, M, M, 17]


def test_threshold_one_commits_exactly_one():
    s = st(5, M, M, M, M, M, M, M)
    c = cf(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
    out = commit(s, c, TOK, M, None, 1.0)
    assert (out != M).sum() == 2 and out[1] == 11


def test_sub_block_window():
    s = st(5, 6, 7, 8, M, M, M, M)
    assert window_positions(s, M, 4).tolist() == [4, 5, 6, 7]
    s = st(5, M, 7, 8, M, M, M, M)
    assert window_positions(s, M, 4).tolist() == [1]
    c = cf(1.0, 0.1, 1, 1, 0.99, 0.99, 0.99, 0.99)
    # only position 1 (first sub-block) may be committed, although it is the least confident
    assert commit(s, c, TOK, M, 4, 0.9).tolist() == [5, 11, 7, 8, M, M, M, M]
    s = st(5, 6, 7, 8, M, M, M, M)
    assert commit(s, c, TOK, M, 4, 0.9).tolist() == [5, 6, 7, 8, 14, 15, 16, 17]
    assert commit(s, c, TOK, M, None, 0.995).tolist() == [5, 6, 7, 8, 14, M, M, M]


def test_rank_order():
    s = st(5, M, M, M, M, M, M, M)
    c = cf(1.0, 0.2, 0.9, 0.5, 0.1, 0.95, 0.5, 0.3)
    assert rank_masked_positions(s, c, M, None) == [5, 2, 3, 6, 7, 1, 4]
    assert rank_masked_positions(s, c, M, 4) == [2, 3, 1, 5, 6, 7, 4]
    assert rank_masked_positions(s.tolist(), c.tolist(), M, 4) == [2, 3, 1, 5, 6, 7, 4]  # lists, as build_drafts


def test_block_finished():
    s = st(5, 6, M, M)
    assert not block_finished(s, M, 4, None)
    assert block_finished(s, M, 2, None)
    assert block_finished(st(5, 1, M, M), M, 4, 1)       # eos with nothing masked before it
    assert not block_finished(st(5, M, 1, M), M, 4, 1)   # masked position before the eos
    assert not block_finished(st(5, 1, M, M), M, 4, None)
    assert block_finished(st(5, 6, 7, 8), M, 4, 1)


def test_block_finished_after_the_prompt_tail():
    """Positions before ``start`` are the prompt's tail (Fast-dLLM v2's first block): never counted, and
    an eos among them ends nothing."""
    assert not block_finished(st(1, 6, M, M), M, 2, 1, start=2)   # the tail's eos is not generated
    assert block_finished(st(1, 6, 7, M), M, 1, 1, start=2)       # the one counted position is committed
    assert block_finished(st(5, 6, 1, M), M, 2, 1, start=2)       # a generated eos, nothing masked before it
    assert not block_finished(st(5, M, 7, 1), M, 2, 1, start=1)   # a mask before the generated eos


@given(hs.lists(hs.integers(0, 4), min_size=1, max_size=12), hs.integers(0, 12), hs.sampled_from([None, 1, 2]),
       hs.integers(0, 4))
def test_block_finished_list_equals_tensor(tokens, need, eos, start):
    """Drafts check their states as lists: the same answer as the tensor form (mask id 3 here)."""
    assert block_finished(tokens, 3, need, eos, start) == block_finished(torch.tensor(tokens), 3, need, eos, start)


@given(hs.integers(0, 2**31 - 1), hs.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       hs.integers(1, 40), hs.integers(-2, 45), hs.booleans())
def test_next_token_is_the_token_confidence_picks(seed, dtype, vocab, mask_id, ties):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 2, vocab, generator=g)
    if ties:  # few distinct values: the argmax is decided among tied tokens (the lowest id wins)
        logits = torch.randint(-2, 2, (3, 2, vocab), generator=g).float()
    logits = logits.to(dtype)
    for mask in (mask_id, None):
        assert torch.equal(next_token(logits, mask), confidence(logits, mask)[1])
        assert torch.equal(next_token(logits[0, 0], mask), confidence(logits[0, 0], mask)[1])


@given(size=hs.integers(1, 40), data=hs.data())
def test_spread_confidences_puts_each_value_at_its_position(size, data):
    positions = data.draw(hs.lists(hs.integers(0, size - 1), unique=True, max_size=size))
    conf = torch.rand(len(positions)) + 0.5
    tok = torch.randint(0, 7, (len(positions),))
    full_conf, full_tok = spread_confidences(conf, tok, torch.tensor(positions, dtype=torch.long), size, 99)
    at = torch.zeros(size, dtype=torch.bool)
    at[positions] = True
    assert torch.equal(full_conf[positions], conf) and torch.equal(full_tok[positions], tok)
    assert (full_conf[~at] == 0).all() and (full_tok[~at] == 99).all()
