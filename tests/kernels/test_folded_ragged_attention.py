"""Folded ragged attention (each packed row's prefix walked once, every position's block through the origin
map) against its pure-torch twin and against dense ragged attention on the rows expanded through the slots:
random fold masks and parent chains within each request, packed rows past the computed count, empty
prefixes, lengths past the capacity, requests without rows, GQA, the prefix split into ranges."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

pytest.importorskip("triton")

from specfold_compile.kernels import (  # noqa: E402
    folded_ragged_attention, folded_ragged_attention_ref, ragged_attention, resolve_folds_ref,
)
from specfold_compile.testing import ATT, DEVICE, DTYPES, randn, tol  # noqa: E402


def packing(counts, B, gen, fold_share=0.5):
    """Parents within each request (its first row -1, every other row one of its earlier rows), a random
    fold mask (first rows never fold) and its resolution over the concatenation: (rows [R * B], count, slot
    [R, B])."""
    parents = []
    for c in filter(None, counts):  # (a request without rows adds none)
        base = len(parents)
        parents += [-1] + [base + int(torch.randint(0, n, (1,), generator=gen)) for n in range(1, c)]
    R = len(parents)
    parents = torch.tensor(parents, dtype=torch.int64)
    fold = (torch.rand(R, B, generator=gen) < fold_share) & (parents >= 0)[:, None]
    _, rows, count, slot = resolve_folds_ref(fold, parents)
    return rows, int(count), slot


def problem(counts, B, Hkv, G, D, C, lengths, dtype, gen, pad=0, spare_slots=1, fold_share=0.5):
    """Packed q, k, v (the computed rows and ``pad`` rows past them, as a fixed capacity leaves), rows,
    slot, a pool [S, Hkv, C, D], the row bounds, distinct random slots and the lengths (device tensors)."""
    rows, count, slot = packing(counts, B, gen, fold_share)
    P = count + pad
    rows = torch.cat((rows[:count], torch.zeros(pad, dtype=torch.int64)))  # the gates' padding: position 0
    q_p = randn(P, Hkv * G + 1, D, dtype=dtype, gen=gen)[:, 1:]  # a padded head stride
    k_p, v_p = randn(P, Hkv, D, dtype=dtype, gen=gen), randn(P, Hkv, D, dtype=dtype, gen=gen)
    S = len(counts) + spare_slots
    k_pool, v_pool = randn(S, Hkv, C, D, dtype=dtype, gen=gen), randn(S, Hkv, C, D, dtype=dtype, gen=gen)
    slots = torch.randperm(S, generator=gen)[:len(counts)]
    bounds = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int64)
    dev = dict(device=DEVICE)
    return (q_p, k_p, v_p, rows.to(**dev), slot.to(**dev), k_pool, v_pool, bounds.to(**dev), slots.to(**dev),
            torch.tensor(lengths, dtype=torch.int64, **dev))


@settings(deadline=None, max_examples=20)
@given(counts=st.lists(st.integers(0, 3), min_size=1, max_size=4).filter(any), B=st.integers(1, 6),
       Hkv=st.integers(1, 2), G=st.sampled_from([1, 2, 3]), D=st.sampled_from([8, 16]),
       C=st.sampled_from([0, 1, 5, 17]), pad=st.integers(0, 3), fold_share=st.sampled_from([0.0, 0.5, 0.9]),
       dtype=st.sampled_from(DTYPES), data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_folded_ragged_attention_matches_reference(counts, B, Hkv, G, D, C, pad, fold_share, dtype, data, seed):
    lengths = data.draw(st.lists(st.integers(0, C + 2), min_size=len(counts), max_size=len(counts)), label="lengths")
    gen = torch.Generator().manual_seed(seed)
    args = problem(counts, B, Hkv, G, D, C, lengths, dtype, gen, pad=pad, fold_share=fold_share)
    scale = 1.0 / math.sqrt(D)
    out = folded_ragged_attention(*args, scale)
    ref = folded_ragged_attention_ref(*args, scale)
    assert out.shape == (sum(counts), B, Hkv * G, D) and out.dtype == dtype
    torch.testing.assert_close(out, ref, **tol(dtype))


@settings(deadline=None, max_examples=12)
@given(counts=st.lists(st.integers(1, 3), min_size=1, max_size=3), B=st.integers(1, 5), Hkv=st.integers(1, 2),
       G=st.sampled_from([1, 3]), C=st.sampled_from([1, 17, 40]), splits=st.integers(2, 4), pad=st.integers(0, 2),
       data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_split_prefix_is_dense_ragged_attention_expanded(counts, B, Hkv, G, C, splits, pad, data, seed):
    """fp32, the prefix cut into 1-4 ranges of the capacity (ranges past a length are empty states): the
    dense ragged kernel over q, k, v expanded to every position through the slots, and the twin."""
    lengths = data.draw(st.lists(st.integers(0, C + 2), min_size=len(counts), max_size=len(counts)), label="lengths")
    gen = torch.Generator().manual_seed(seed)
    q_p, k_p, v_p, rows, slot, *pool = problem(counts, B, Hkv, G, 16, C, lengths, torch.float32, gen, pad=pad)
    dense = ragged_attention(q_p[slot], k_p[slot], v_p[slot], *pool, 0.25)
    for s in (1, splits):
        out = folded_ragged_attention(q_p, k_p, v_p, rows, slot, *pool, 0.25, splits=s)
        torch.testing.assert_close(out, dense, **tol(torch.float32))


def test_64_requests_and_tiles_across_requests():
    """64 requests of 0-3 rows over ragged prefixes (some empty, some past the capacity) in one launch: tiles
    of packed rows hold several requests, each row keeps its own request's state."""
    gen = torch.Generator().manual_seed(11)
    counts = torch.randint(0, 4, (64,), generator=gen).tolist()
    lengths = torch.randint(0, 9, (64,), generator=gen).tolist()
    args = problem(counts, 2, 1, 2, 8, 7, lengths, torch.float32, gen, pad=5, spare_slots=8)
    torch.testing.assert_close(folded_ragged_attention(*args, 0.3), folded_ragged_attention_ref(*args, 0.3),
                               **tol(torch.float32))


def test_splits_from_the_tuning_off_the_gpu():
    """With a tuning the split count comes from the shapes (one under the interpreter): the values of
    splits=1."""
    gen = torch.Generator().manual_seed(4)
    args = problem([2, 1], 3, 2, 2, 8, 9, [4, 9], torch.float32, gen, pad=1)
    torch.testing.assert_close(folded_ragged_attention(*args, 0.3, tuning=ATT),
                               folded_ragged_attention(*args, 0.3, splits=1), rtol=0, atol=0)


def test_op_falls_back_to_the_twin(monkeypatch):
    """Off the GPU and outside the interpreter ``ops.folded_ragged_attention`` runs the pure-torch twin: the
    same values as the kernel."""
    from specfold_compile import ops

    args = problem([2, 0, 1], 4, 2, 2, 8, 5, [0, 5, 3], torch.float32, torch.Generator().manual_seed(5), pad=2)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fallback = ops.folded_ragged_attention(*args, 0.3)
    monkeypatch.undo()
    if DEVICE == "cpu":
        torch.testing.assert_close(fallback, folded_ragged_attention_ref(*args, 0.3), rtol=0, atol=0)
    torch.testing.assert_close(fallback, folded_ragged_attention(*args, 0.3), **tol(torch.float32))
    torch.testing.assert_close(ops.folded_ragged_attention(*args, 0.3), folded_ragged_attention(*args, 0.3),
                               rtol=0, atol=0)


def _good():
    return list(problem([1, 2], 3, 2, 2, 8, 4, [1, 2], torch.float32, torch.Generator().manual_seed(1), pad=1))


@pytest.mark.parametrize("index, bad, name", [
    (0, lambda t: t[0], "q"),
    (1, lambda t: t[..., :4], "k"),
    (3, lambda t: t[:-1], "rows"),
    (3, lambda t: t.float(), "rows"),
    (5, lambda t: t[:, :1], "k_pool"),
    (6, lambda t: t.double(), "v_pool"),
    (7, lambda t: t[:1], "bounds"),
    (8, lambda t: t[:1], "slots"),
    (9, lambda t: t.float(), "lengths"),
])
def test_bad_input_names_the_argument(index, bad, name):
    args = _good()
    args[index] = bad(args[index])
    with pytest.raises(ValueError, match=rf"^{name}: expected"):
        folded_ragged_attention(*args, 0.3)


@pytest.mark.parametrize("kw, message", [
    (dict(splits=0), "^splits: expected None or an int >= 1, got 0"),
    (dict(tuning="fast"), "^tuning: expected an AttentionTuning"),
    (dict(config=(16, 16, 3, 1)), "^config: expected"),
])
def test_bad_options(kw, message):
    with pytest.raises(ValueError, match=message):
        folded_ragged_attention(*_good(), 0.3, **kw)
