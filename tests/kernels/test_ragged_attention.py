"""Ragged-prefix branch attention (one launch over several requests' rows, each against its own slot of a
pool) against its pure-torch twin and against branch attention run per request on that request's sliced
prefix: empty prefixes, lengths past the capacity, requests without rows, GQA, causal blocks, the prefix
split into ranges, 64 requests."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

pytest.importorskip("triton")

from specfold_compile import ops  # noqa: E402
from specfold_compile.kernels import branch_attention, ragged_attention, ragged_attention_ref  # noqa: E402
from specfold_compile.testing import ATT, DEVICE, DTYPES, randn, tol  # noqa: E402

SETTINGS = dict(deadline=None, max_examples=20)


def strided(shape, dtype, gen):
    """A random tensor of ``shape`` [R, B, H, D] as a view with a padded head stride (last dim contiguous)."""
    R, B, H, D = shape
    return randn(R, B, H + 1, D, dtype=dtype, gen=gen)[:, :, 1:]


def problem(counts, B, Hkv, G, D, C, lengths, dtype, gen, index_dtype=torch.int64, spare_slots=1):
    """q, k, v of the concatenated rows, a pool [S, Hkv, C, D] (S = requests + spare slots), the row bounds,
    a random choice of distinct slots and the lengths, as device tensors."""
    R = sum(counts)
    S = len(counts) + spare_slots
    q = strided((R, B, Hkv * G, D), dtype, gen)
    k, v = strided((R, B, Hkv, D), dtype, gen), strided((R, B, Hkv, D), dtype, gen)
    k_pool, v_pool = randn(S, Hkv, C, D, dtype=dtype, gen=gen), randn(S, Hkv, C, D, dtype=dtype, gen=gen)
    slots = torch.randperm(S, generator=gen)[:len(counts)]
    bounds = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=index_dtype)
    as_dev = dict(dtype=index_dtype, device=DEVICE)
    return (q, k, v, k_pool, v_pool, bounds.to(DEVICE), slots.to(**as_dev),
            torch.tensor(lengths, **as_dev))


def per_request(q, k, v, k_pool, v_pool, bounds, slots, lengths, scale, attend):
    """Each request alone: ``attend`` (branch attention) on its rows against its slot's first
    min(length, capacity) keys, sliced."""
    outs, edges = [], bounds.tolist()
    for i in range(len(edges) - 1):
        a, e = edges[i], edges[i + 1]
        if a < e:
            s, L = int(slots[i]), min(int(lengths[i]), k_pool.shape[2])
            outs.append(attend(q[a:e], k[a:e], v[a:e], k_pool[s, :, :L], v_pool[s, :, :L], scale))
    return torch.cat(outs) if outs else q.new_zeros(q.shape)


def kernel_branch_attention(q, k, v, k_pre, v_pre, scale):
    return branch_attention(q, k, v, k_pre, v_pre, scale, tuning=ATT)


@settings(**SETTINGS)
@given(counts=st.lists(st.integers(0, 3), min_size=1, max_size=4), B=st.integers(1, 6), Hkv=st.integers(1, 2),
       G=st.sampled_from([1, 2, 3]), D=st.sampled_from([8, 16]), C=st.sampled_from([0, 1, 5, 17]),
       causal=st.booleans(), dtype=st.sampled_from(DTYPES), index_dtype=st.sampled_from([torch.int32, torch.int64]),
       data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_ragged_attention_matches_reference(counts, B, Hkv, G, D, C, causal, dtype, index_dtype, data, seed):
    lengths = data.draw(st.lists(st.integers(0, C + 2), min_size=len(counts), max_size=len(counts)), label="lengths")
    gen = torch.Generator().manual_seed(seed)
    args = problem(counts, B, Hkv, G, D, C, lengths, dtype, gen, index_dtype)
    scale = 1.0 / math.sqrt(D)
    out = ragged_attention(*args, scale, causal)
    ref = ragged_attention_ref(*args, scale, causal)
    assert out.shape == args[0].shape and out.dtype == dtype
    torch.testing.assert_close(out, ref, **tol(dtype))


@settings(deadline=None, max_examples=12)
@given(counts=st.lists(st.integers(0, 3), min_size=1, max_size=3), B=st.integers(1, 5), Hkv=st.integers(1, 2),
       G=st.sampled_from([1, 3]), C=st.sampled_from([1, 17, 40]), splits=st.integers(2, 4),
       dtype=st.sampled_from(DTYPES), data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_ragged_attention_split_prefix(counts, B, Hkv, G, C, splits, dtype, data, seed):
    """The prefix cut into 2-4 ranges of the capacity (states merged by the block kernel): the same as the
    twin, ranges past a request's length (empty states) included."""
    lengths = data.draw(st.lists(st.integers(0, C + 2), min_size=len(counts), max_size=len(counts)), label="lengths")
    gen = torch.Generator().manual_seed(seed)
    args = problem(counts, B, Hkv, G, 16, C, lengths, dtype, gen)
    out = ragged_attention(*args, 0.25, splits=splits)
    torch.testing.assert_close(out, ragged_attention_ref(*args, 0.25), **tol(dtype))


@settings(deadline=None, max_examples=12)
@given(counts=st.lists(st.integers(1, 3), min_size=1, max_size=3), B=st.integers(1, 5), Hkv=st.integers(1, 2),
       G=st.sampled_from([1, 2, 4]), C=st.sampled_from([0, 3, 17]), data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_ragged_attention_is_branch_attention_per_request(counts, B, Hkv, G, C, data, seed):
    """fp32: equal to branch attention (the Triton kernels and the reference) on each request's rows and its
    sliced prefix."""
    lengths = data.draw(st.lists(st.integers(0, C), min_size=len(counts), max_size=len(counts)), label="lengths")
    gen = torch.Generator().manual_seed(seed)
    args = problem(counts, B, Hkv, G, 16, C, lengths, torch.float32, gen)
    out = ragged_attention(*args, 0.25)
    for attend in (kernel_branch_attention, ops.branch_attention):
        torch.testing.assert_close(out, per_request(*args, 0.25, attend), **tol(torch.float32))


def test_ragged_attention_64_requests():
    """64 requests of 0-3 rows with ragged prefixes (some empty, some full) in one launch, against the
    per-request loop; also the op, which runs this kernel here."""
    gen = torch.Generator().manual_seed(7)
    counts = torch.randint(0, 4, (64,), generator=gen).tolist()
    lengths = torch.randint(0, 7, (64,), generator=gen).tolist()
    lengths[:3] = [0, 6, 6]
    args = problem(counts, 2, 1, 2, 8, 6, lengths, torch.float32, gen, spare_slots=8)
    out = ragged_attention(*args, 0.3)
    torch.testing.assert_close(out, per_request(*args, 0.3, ops.branch_attention), **tol(torch.float32))
    torch.testing.assert_close(ops.ragged_attention(*args, 0.3), out, rtol=0, atol=0)


def test_ragged_attention_one_request_is_branch_attention():
    """A single request over the whole pool slot, row bounds [0, R]: branch attention with prefix_len."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, k_pool, v_pool, bounds, slots, lengths = problem([4], 3, 2, 2, 16, 9, [5], torch.float32, gen)
    out = ragged_attention(q, k, v, k_pool, v_pool, bounds, slots, lengths, 0.2)
    s = int(slots[0])
    ref = branch_attention(q, k, v, k_pool[s], v_pool[s], 0.2, prefix_len=lengths[0], tuning=ATT)
    torch.testing.assert_close(out, ref, **tol(torch.float32))


def test_ragged_op_falls_back_to_the_reference(monkeypatch):
    """Off the GPU and outside the interpreter the op runs the pure-torch twin: the same values."""
    gen = torch.Generator().manual_seed(5)
    args = problem([2, 0, 1], 4, 2, 2, 8, 5, [0, 5, 3], torch.float32, gen)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fallback = ops.ragged_attention(*args, 0.3, True)
    monkeypatch.undo()
    if DEVICE == "cpu":
        torch.testing.assert_close(fallback, ragged_attention_ref(*args, 0.3, True), rtol=0, atol=0)
    torch.testing.assert_close(fallback, ragged_attention(*args, 0.3, True), **tol(torch.float32))


def _good():
    gen = torch.Generator().manual_seed(1)
    return list(problem([1, 2], 3, 2, 2, 8, 4, [1, 2], torch.float32, gen))


@pytest.mark.parametrize("index, bad, name", [
    (0, lambda t: t[0], "q"),
    (1, lambda t: t[..., :4], "k"),
    (2, lambda t: t.double(), "v"),
    (3, lambda t: t[:, :1], "k_pool"),
    (4, lambda t: t[..., :4], "v_pool"),
    (5, lambda t: t[:1], "bounds"),
    (5, lambda t: t.float(), "bounds"),
    (6, lambda t: t[:1], "slots"),
    (7, lambda t: t.view(2, 1), "lengths"),
    (0, lambda t: t.transpose(1, 3).contiguous().transpose(1, 3), "q"),  # last dim not contiguous
    (3, lambda t: t.double(), "k_pool"),
    (6, lambda t: t.float(), "slots"),
    (7, lambda t: t[:1], "lengths"),
])
def test_ragged_attention_bad_input(index, bad, name):
    args = _good()
    args[index] = bad(args[index])
    with pytest.raises(ValueError, match=rf"^{name}: expected"):
        ragged_attention(*args, 0.3)


@pytest.mark.parametrize("kw, message", [
    (dict(splits=0), "^splits: expected None or an int >= 1, got 0"),
    (dict(splits=2, causal=True), "^splits: causal attention runs in one pass"),
    (dict(tuning="fast"), "^tuning: expected an AttentionTuning"),
    (dict(config=(16, 16, 3, 1)), "^config: expected"),
])
def test_ragged_attention_bad_options(kw, message):
    with pytest.raises(ValueError, match=message):
        ragged_attention(*_good(), 0.3, **kw)


def test_ragged_splits_off_the_gpu():
    """The split count is a shape-only choice; one split under the interpreter or off the GPU, and with
    ``tuning`` the default path takes it (here: one pass, the same values as splits=1)."""
    from specfold_compile.kernels.ragged_attention import ragged_splits

    assert ragged_splits(4, 32, 12, 2, 4096, torch.device("cpu"), ATT) == 1
    args = _good()
    torch.testing.assert_close(ragged_attention(*args, 0.3, tuning=ATT), ragged_attention(*args, 0.3, splits=1),
                               rtol=0, atol=0)
