"""The training layout on the absolute block grid: the mask equals what the decoder's cache is written
with, position for position; every response token has exactly one loss term; seeds sit exactly where the
decoder reads one; the prompt's tail is never masked."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specfold_compile.training.layout import (IGNORE, Layout, fill_response, grid_blocks, layout_loss,
                                              make_batch)

MASK, EOS = 0, 1
B = 32


def _decoder_roles(L, n_tokens):
    """What each layout index is in the cached decoder, from the decoder's rules alone (the layout's
    documented order: the clean stream, then copy A, then copy B).

    Returns (roles, allowed): roles[i] = ("cache", p) for a key written to the cache at absolute position
    p (the block-causal prefill of the prompt's whole blocks, or a finished block's write pass), or
    ("block", copy, p) for position p of a block being denoised; allowed(q, k) says whether the decoder's
    forward that computes q attends to k."""
    n_prompt = L // B
    n_all = n_tokens // B
    last = n_all - 1  # the last decoded block is denoised but never written (it holds the eos)
    roles = [("cache", p) for p in range(last * B)]
    for copy in ("A", "B"):
        roles += [("block", copy, p) for p in range(n_prompt * B, n_all * B)]

    def allowed(q, k):
        rq, rk = roles[q], roles[k]
        pq, pk = rq[-1], rk[-1]
        if rq[0] == "cache":
            # prefill (rule 1) and block write (rule 3): the prefix cache and, bidirectionally, the block
            return rk[0] == "cache" and pk < (pq // B + 1) * B
        # a block being denoised (rule 2): the cache written so far (every block before it) and itself
        if rk[0] == "cache":
            return pk < pq // B * B
        return rk[1] == rq[1] and pk // B == pq // B

    return roles, allowed


def _example(L, R, g):
    prompt = [2] + torch.randint(5, 50, (L - 1,), generator=g).tolist()
    resp = torch.randint(5, 50, (R,), generator=g).tolist()
    return prompt, resp


CASES = [(L, R) for L in (1, 5, 31, 32, 33, 40, 64, 70) for R in (0, 3, 30, 40)]


@pytest.mark.parametrize("L,R", CASES)
def test_mask_is_the_decoders_cache_mask(L, R):
    n_prompt, n_dec = grid_blocks(L, R)
    lay = Layout(n_prompt, n_dec)
    filled = fill_response(list(range(5, 5 + R)), L, EOS)
    assert (L + len(filled)) % B == 0 and len(filled) > R and filled[R:] == [EOS] * (len(filled) - R)
    roles, allowed = _decoder_roles(L, L + len(filled))
    assert lay.T == len(roles)
    t = lay.tensors()
    assert t["pos"].tolist() == [r[-1] for r in roles]  # RoPE positions: absolute from the first token
    m = lay.mask()
    expected = torch.tensor([[allowed(q, k) for k in range(lay.T)] for q in range(lay.T)])
    assert torch.equal(m, expected)


@given(L=st.integers(1, 100), R=st.integers(0, 70), seed=st.integers(0, 2 ** 16))
@settings(max_examples=40, deadline=None)
def test_targets_noise_and_seeds(L, R, seed):
    g = torch.Generator().manual_seed(seed)
    prompt, resp = _example(L, R, g)
    n_prompt, n_dec = grid_blocks(L, R)
    lay = Layout(n_prompt, n_dec)
    full = prompt + fill_response(resp, L, EOS)
    rows = torch.tensor([lay.row(prompt, full[L:])] * 2)  # two draws of the noise for the same example
    inp, tgt, attn = make_batch(rows, torch.tensor([L, L]), lay, MASK, g)
    assert torch.equal(attn, lay.mask())
    roles, allowed = _decoder_roles(L, len(full))
    for r in range(2):
        assert rows[r].tolist() == [full[role[-1]] for role in roles]
        masked_at = {}  # absolute position -> copy
        for i, role in enumerate(roles):
            if inp[r, i] == MASK:
                assert role[0] == "block" and role[-1] >= L and role[-1] % B != 0
                assert role[-1] not in masked_at  # complementary copies
                masked_at[role[-1]] = role[1]
            else:
                assert inp[r, i] == rows[r, i]
        # every maskable response token (block position >= 1) is masked in exactly one copy; prompt tail
        # and block position 0 never
        assert set(masked_at) == {p for p in range(L, len(full)) if p % B}
        # targets: target of logits[s]; each response token exactly once
        seen = {}
        for s in torch.nonzero(tgt[r] != IGNORE).flatten().tolist():
            role = roles[s]
            if role[0] == "block":  # shifted read of the masked token right after s, same copy and block
                nxt = roles[s + 1]
                assert nxt[0] == "block" and nxt[1] == role[1] and nxt[-1] == role[-1] + 1
                assert nxt[-1] // B == role[-1] // B and inp[r, s + 1] == MASK
                p = nxt[-1]
            else:  # seed: the last position of a prefilled / written block predicts the next block's first
                p = role[-1] + 1
                assert p % B == 0
            assert tgt[r, s] == full[p]
            assert p not in seen
            seen[p] = s
        assert set(seen) == set(range(L, len(full)))
        # seeds exactly where the decoder reads one: position 0 of every decoded block that starts with a
        # generated token (all after the first; the first only when the prompt fills whole blocks)
        seeded = {p for p in seen if roles[seen[p]][0] == "cache"}
        first = n_prompt * B
        assert seeded == {p for p in range(first, len(full), B) if p > first or L % B == 0}


def test_row_rejects_an_example_off_the_layout():
    lay = Layout(1, 1)
    with pytest.raises(ValueError, match="example"):
        lay.row([2] * 20, fill_response([5] * 3, 20, EOS))  # 0 whole prompt blocks, not 1
    with pytest.raises(ValueError, match="example"):
        lay.row([2] * 40, fill_response([5] * 30, 40, EOS))  # 2 decoded blocks, not 1
    with pytest.raises(ValueError, match="n_decoded"):
        Layout(0, 0)


def test_grid_blocks():
    assert grid_blocks(1, 0) == (0, 1)
    assert grid_blocks(31, 0) == (0, 1)
    assert grid_blocks(32, 0) == (1, 1)    # eos alone in the first decoded block
    assert grid_blocks(20, 11) == (0, 1)   # 20 + 11 + eos = 32
    assert grid_blocks(20, 12) == (0, 2)
    assert grid_blocks(42, 25) == (1, 2)


def test_layout_loss_reads_each_target_at_its_own_index():
    V = 7
    logits = torch.full((1, 4, V), -30.0)
    logits[0, 1, 5] = 30.0
    logits[0, 2, 3] = 30.0
    assert layout_loss(logits, torch.tensor([[IGNORE, 5, IGNORE, IGNORE]])).item() < 1e-6
    assert layout_loss(logits, torch.tensor([[IGNORE, IGNORE, 5, IGNORE]])).item() > 10
