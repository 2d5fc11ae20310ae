"""The buckets ``serving.graphs.BatchGraphs`` pads a pass to (rows, requests) and the positions a SpecFold
graph's gates pack (``fine_bucket``, the capacity levels, ``capacity_from_masks``)."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specfold_compile.serving.graphs import BatchGraphs, capacity_from_masks, fine_bucket, request_bucket, row_bucket
from specfold_compile.testing import TINY_FAMILIES as FAMILIES, tiny_model


# --- buckets -------------------------------------------------------------------------------------

def _series(least: int, up_to: int) -> list[int]:
    """Powers of two from ``least`` on and 1.5 times each: 8, 12, 16, 24, 32, 48, ..."""
    out, p = [], least
    while p <= up_to:
        out += [p, p * 3 // 2]
        p *= 2
    return out


def test_row_bucket_series():
    assert [row_bucket(n) for n in (1, 8, 9, 12, 13, 16, 17, 24, 25, 32, 33, 48, 49, 64, 65)] == \
        [8, 8, 12, 12, 16, 16, 24, 24, 32, 32, 48, 48, 64, 64, 96]
    assert [row_bucket(n, 16) for n in (1, 16, 17, 24, 25, 33)] == [16, 16, 24, 24, 32, 48]
    for least in (8, 16):
        series = _series(least, 1 << 14)
        for n in range(1, 5000):
            b = row_bucket(n, least)
            assert b == min(s for s in series if s >= n), (least, n, b)  # the first of the series that fits
            if n > least:
                assert b < 1.5 * n, (least, n, b)  # at most a third is padding


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 10**7))
def test_row_bucket_pads_at_most_a_third(n):
    b = row_bucket(n)
    assert b >= max(n, 8) and b in _series(8, 2 * b)
    assert b < 1.5 * n or n <= 8
    assert row_bucket(b) == b and row_bucket(b + 1) > b


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 10**7))
def test_request_bucket_is_the_next_power_of_two(n):
    q = request_bucket(n)
    assert q > n and q & (q - 1) == 0 and q // 2 <= n


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 10**6))
def test_fine_bucket_pads_at_most_an_eighth(n):
    b = fine_bucket(n)
    assert n <= b <= n + n / 8 and fine_bucket(b) == b
    if n > 8:
        assert 8 <= b >> (b.bit_length() - 4) < 16 and b % (1 << (b.bit_length() - 4)) == 0


def test_capacity_levels():
    """A gate packs the main rows' positions plus its share of the draft rows' (doubled a level, at most
    every position; both counts by ``fine_bucket``) and at least ``min_packed``; everything at tau = 0."""
    model = tiny_model(FAMILIES[0])
    block, gates = model.config.block_size, len(model.layers)
    shares = tuple([0.25] + [0.5] * (gates - 1))
    graphs = BatchGraphs(model, 3, 32, "eager", fold_capacity=shares, min_packed=0, capacity_spread=0)
    r_pad, n_req, n_rows = 12, 3, 12  # 3 main rows, 9 draft rows
    others = 9 * block
    assert graphs._capacity(r_pad, n_req, n_rows, 0.3) == \
        (3 * block + others // 4,) + (3 * block + others // 2,) * (gates - 1)
    assert graphs._capacity(r_pad, n_req, n_rows, 0.3, 1) == (3 * block + others // 2,) + (r_pad * block,) * (gates - 1)
    assert graphs._capacity(r_pad, n_req, n_rows, 0.3, 2) == (r_pad * block,) * gates
    assert graphs._capacity(r_pad, n_req, n_rows, 0.0) == (r_pad * block,) * gates
    # 17 requests of 35 rows: 18 main rows and 18 draft rows packed (fine_bucket), the padding to 48 none
    assert graphs._capacity(48, 17, 35, 0.3, 1)[1:] == ((18 + 18) * block,) * (gates - 1)
    # the margin: 1 + spread / sqrt(draft rows), here 1 + 1.5 / 3 over 9 draft rows
    spread = BatchGraphs(model, 3, 32, "eager", fold_capacity=shares, min_packed=0, capacity_spread=1.5)
    assert spread._capacity(r_pad, n_req, n_rows, 0.3)[0] == 3 * block + math.ceil(0.25 * 1.5 * others)
    assert spread._capacity(r_pad, n_req, n_rows, 0.3)[1] == 3 * block + math.ceil(0.5 * 1.5 * others)
    floor = BatchGraphs(model, 3, 32, "eager", fold_capacity=shares, min_packed=6 * block, capacity_spread=0)
    assert floor._capacity(r_pad, n_req, n_rows, 0.3)[0] == 6 * block
    assert floor._capacity(64, 3, 64, 0.3)[0] > 6 * block
    assert BatchGraphs(model, 3, 32, "eager")._capacity(r_pad, n_req, n_rows, 0.3) == (r_pad * block,) * gates


@settings(max_examples=30, deadline=None)
@given(gates=st.integers(1, 4), rows=st.integers(2, 5), seed=st.integers(0, 2**16), margin=st.sampled_from([1.0, 1.5]))
def test_capacity_from_masks_is_each_gates_computed_share(gates, rows, seed, margin):
    """Each gate's share of draft positions computed (row 0 left out), times ``margin``, rounded up to
    a 32nd, within [1/32, 1]; its packed rows then hold the share of positions the masks computed."""
    gen = torch.Generator().manual_seed(seed)
    masks = [torch.rand(gates, rows + i, 8, generator=gen) < 0.7 for i in range(3)]
    shares = capacity_from_masks(masks, margin)
    assert len(shares) == gates
    for g, share in enumerate(shares):
        drafts = torch.cat([m[g, 1:].flatten() for m in masks])
        want = float((~drafts).double().mean()) * margin
        assert 1 / 32 <= share <= 1 and (share * 32) == round(share * 32)
        assert share >= min(1.0, want) - 1e-12 and (share - 1 / 32 < want or share == 1 / 32)
    with pytest.raises(ValueError, match=r"^fold_masks: expected at least one mask with draft rows"):
        capacity_from_masks([m[:, :1] for m in masks])
