import torch

from specfold_compile.training.layout import (CLEAN_T, IGNORE, NOISY_A, NOISY_B, PAD_T, PROMPT_T, Layout,
                                              attention_mask, fill_response, make_batch, shifted_loss)

MASK, EOS, PAD = 0, 1, 3


def _allowed(typ, blk):
    """Reference: the rule written out pair by pair."""
    T = len(typ)
    m = torch.zeros(T, T, dtype=torch.bool)
    for q in range(T):
        for k in range(T):
            tq, tk, bq, bk = typ[q], typ[k], blk[q], blk[k]
            if tq == PAD_T:
                ok = q == k
            elif tq == PROMPT_T:
                ok = tk == PROMPT_T and k <= q
            elif tq == CLEAN_T:
                ok = tk == PROMPT_T or (tk == CLEAN_T and bk <= bq)
            else:
                ok = tk == PROMPT_T or (tk == CLEAN_T and bk < bq) or (tk == tq and bk == bq)
            m[q, k] = ok
    return m


def test_attention_mask_matches_rule():
    lay = Layout(prompt_len=5, resp_len=8, block=4)
    plen, nblk = torch.tensor([3, 5, 2]), torch.tensor([2, 1, 2])
    typ, blk, off = lay.meta(plen, nblk)
    m = attention_mask(typ, blk)
    for r in range(3):
        assert torch.equal(m[r], _allowed(typ[r].tolist(), blk[r].tolist()))
    # row 0: 2 left pads, prompt 3, two clean blocks of 4, then copies
    assert typ[0].tolist() == [0, 0, 1, 1, 1] + [2] * 8 + [3] * 8 + [4] * 8
    assert typ[1].tolist() == [1] * 5 + [2] * 4 + [0] * 4 + [3] * 4 + [0] * 4 + [4] * 4 + [0] * 4
    assert blk[0, 5:13].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert off[0, 13:21].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    # noisy block 1 of copy A sees prompt, clean block 0, itself; not clean block 1, not copy B
    q = 13 + 4
    assert m[0, q, 2:5].all() and m[0, q, 5:9].all() and not m[0, q, 9:13].any()
    assert m[0, q, 17:21].all() and not m[0, q, 13:17].any() and not m[0, q, 21:].any()
    assert m.any(-1).all()  # every query attends to something (no NaN rows)
    pos = lay.positions()
    assert pos.tolist() == list(range(13)) + list(range(5, 13)) * 2


def test_complementary_masking_and_shift_alignment():
    torch.manual_seed(0)
    lay = Layout(prompt_len=6, resp_len=64, block=32)
    prompts = [[2, 10, 11, 4], [2, 12, 13, 14, 15, 4]]
    resps = [fill_response([20 + i for i in range(40)], EOS), fill_response([50, 51], EOS)]
    rows = torch.tensor([lay.row(p, r, PAD) for p, r in zip(prompts, resps)])
    plen = torch.tensor([4, 6])
    nblk = torch.tensor([2, 1])
    inp, tgt, attn = make_batch(rows, plen, nblk, lay, MASK, torch.Generator().manual_seed(1))
    typ, blk, off = lay.meta(plen, nblk)
    P, R = lay.P, lay.R
    for r in range(2):
        n = len(resps[r])
        a = inp[r, P + R:P + R + n]
        b = inp[r, P + 2 * R:P + 2 * R + n]
        clean = rows[r, P:P + n]
        ma, mb = a == MASK, b == MASK
        offs = torch.arange(n) % 32
        assert not (ma & mb).any()  # complementary
        assert ((ma | mb) == (offs > 0)).all()  # every non-first token masked exactly once
        assert torch.equal(a[~ma], clean[~ma]) and torch.equal(b[~mb], clean[~mb])
        # prompt and clean half untouched
        assert torch.equal(inp[r, :P + R], rows[r, :P + R])
        # targets: masked tokens + first token of each clean block
        u = torch.nonzero(tgt[r] != IGNORE).flatten()
        for ui in u.tolist():
            t = int(typ[r, ui])
            assert tgt[r, ui] == rows[r, ui]
            if t in (NOISY_A, NOISY_B):
                assert inp[r, ui] == MASK and off[r, ui] >= 1
                # shifted: predicted from u-1, same copy and same block
                assert typ[r, ui - 1] == t and blk[r, ui - 1] == blk[r, ui]
            else:
                assert t == CLEAN_T and off[r, ui] == 0
                prev = ui - 1
                if blk[r, ui] == 0:
                    assert typ[r, prev] == PROMPT_T and rows[r, prev] == prompts[r][-1]
                else:
                    assert typ[r, prev] == CLEAN_T and off[r, prev] == 31 and blk[r, prev] == blk[r, ui] - 1
        assert len(u) == (n - n // 32) + n // 32  # every response token has exactly one loss term


def test_shifted_loss_uses_previous_position():
    V = 7
    logits = torch.full((1, 4, V), -30.0)
    logits[0, 1, 5] = 30.0  # predicts the token at index 2
    logits[0, 0, 2] = 30.0  # predicts the token at index 1
    tgt = torch.tensor([[IGNORE, IGNORE, 5, IGNORE]])
    assert shifted_loss(logits, tgt).item() < 1e-6
    tgt = torch.tensor([[IGNORE, 5, IGNORE, IGNORE]])
    assert shifted_loss(logits, tgt).item() > 10
