"""The folded attention kernels over a static cache whose first ``prefix_len`` keys are valid (a
one-element device tensor the kernels load themselves): against the references on the valid slice."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

pytest.importorskip("triton")

from specfold_compile.kernels import (  # noqa: E402
    block_attention_ref, branch_attention, branch_attention_ref, merge_split_states, one_pass_attention,
    prefix_attention, prefix_attention_ref, prefix_attention_states, slot_attention,
)
from specfold_compile.testing import (ATT, DEVICE, DTYPES, attention_tuning, cache_view,  # noqa: E402
                                      packed_problem, randn, strided_q, tol)

SETTINGS = dict(deadline=None, max_examples=25)
GROUPS = [1, 2, 4, 7]


LEN_CAPACITIES = [1, 5, 17, 33]


def prefix_len_tensor(L, shape, dtype):
    """The device-side length: 0-d, or [1] as a view into a bigger buffer (a storage offset)."""
    if shape == "0d":
        return torch.tensor(L, dtype=dtype, device=DEVICE)
    return torch.tensor([L + 7, L, L + 3], dtype=dtype, device=DEVICE)[1:2]


def draw_len(data, P):
    """A length in [0, P + 2]: past the capacity it counts as P (min(prefix_len, P))."""
    return data.draw(st.integers(0, P + 2), label="L")


LEN_ARGS = dict(shape=st.sampled_from(["0d", "[1]"]), len_dtype=st.sampled_from([torch.int32, torch.int64]))


@settings(**SETTINGS)
@given(R=st.integers(1, 6), Hkv=st.integers(1, 2), G=st.sampled_from(GROUPS), D=st.sampled_from([8, 16]),
       P=st.sampled_from(LEN_CAPACITIES), splits=st.sampled_from(["one piece", 1, 2, 3, 4]),
       mid_count=st.booleans(), dtype=st.sampled_from(DTYPES), data=st.data(), seed=st.integers(0, 2**31 - 1),
       **LEN_ARGS)
def test_prefix_attention_prefix_len(R, Hkv, G, D, P, splits, mid_count, dtype, data, seed, shape, len_dtype):
    """The S states over a fixed-capacity prefix with a device-side length merge to the state of the
    sliced prefix; the splits (cut from the capacity) that start at or past the length are empty states,
    the others not."""
    from specfold_compile.kernels import attention as A

    L = draw_len(data, P)
    gen = torch.Generator().manual_seed(seed)
    q = strided_q(R, Hkv * G, D, dtype, gen)
    k_pre, v_pre = cache_view(Hkv, P, D, dtype, gen)
    scale = 1.0 / math.sqrt(D)
    c = R // 2 if mid_count else R
    count = torch.tensor(c, dtype=torch.int64, device=DEVICE) if mid_count else None
    plen = prefix_len_tensor(L, shape, len_dtype)
    if splits == "one piece":
        o, lse = prefix_attention(q, k_pre, v_pre, scale, count, prefix_len=plen)
        o, lse, splits = o[None], lse[None], 1
    else:
        o, lse = prefix_attention_states(q, k_pre, v_pre, scale, count, splits=splits, prefix_len=plen)
    o, lse = o[:, :c], lse[:, :c]
    o_m, lse_m = merge_split_states(o, lse)
    o_ref, lse_ref = prefix_attention_ref(q, k_pre[:, :L], v_pre[:, :L], scale)
    torch.testing.assert_close(o_m, o_ref[:c], **tol(dtype))
    torch.testing.assert_close(lse_m, lse_ref[:c], **tol(dtype))
    block_p = A._prefix_config(R * G, D)[1]
    chunk = math.ceil(math.ceil(P / splits) / block_p) * block_p  # as the launcher cuts the capacity: whole tiles
    for s in range(splits if c > 0 else 0):
        empty = s * chunk >= min(L, P)
        assert torch.all(lse[s] == float("-inf")) == empty and torch.isfinite(lse[s]).all() != empty, (s, chunk, L)
        if empty:
            assert torch.all(o[s] == 0)


@settings(**SETTINGS)
@given(fn=st.sampled_from(["one_pass", "slot: one pass", "slot: two kernels"]), N=st.integers(1, 3),
       B=st.integers(1, 9), Hkv=st.integers(1, 2), G=st.sampled_from(GROUPS), D=st.sampled_from([8, 16]),
       P=st.sampled_from(LEN_CAPACITIES), dtype=st.sampled_from(DTYPES), p_fold=st.sampled_from([0.0, 0.5, 1.0]),
       with_count=st.booleans(), data=st.data(), seed=st.integers(0, 2**31 - 1), **LEN_ARGS)
def test_slot_attention_prefix_len(fn, N, B, Hkv, G, D, P, dtype, p_fold, with_count, data, seed, shape, len_dtype):
    """one_pass_attention and both paths of slot_attention (one pass: the block kernel stops its walk at
    the length; two kernels: the prefix kernel does) with a device-side length equal the reference fed
    the sliced prefix's state."""
    from specfold_compile.kernels import attention as A

    L = draw_len(data, P)
    gen = torch.Generator().manual_seed(seed)
    q, k, v, k_pre, v_pre, slot = packed_problem(N, B, Hkv, G, D, P, dtype, p_fold, gen)
    scale = 0.7 / math.sqrt(D)
    plen = prefix_len_tensor(L, shape, len_dtype)
    count = torch.tensor(q.shape[0] - 2, device=DEVICE) if with_count else None  # the rows any slot points at
    if fn == "one_pass":
        out = one_pass_attention(q, k, v, slot, k_pre, v_pre, scale, prefix_len=plen)
    else:
        tuning = attention_tuning(one_pass_max_prefix=-1) if fn == "slot: two kernels" else ATT
        assert A.use_one_pass(slot.numel(), q.shape[1], P, tuning) == (fn == "slot: one pass")
        out = slot_attention(q, k, v, slot, k_pre, v_pre, scale, count, prefix_len=plen, tuning=tuning)
    ref = block_attention_ref(q, k, v, slot, *prefix_attention_ref(q, k_pre[:, :L], v_pre[:, :L], scale), scale)
    assert out.dtype == q.dtype and out.shape == (N, B, Hkv * G, D)
    torch.testing.assert_close(out.float(), ref.float(), **tol(dtype))


@settings(deadline=None, max_examples=15)
@given(N=st.integers(1, 4), B=st.integers(1, 8), Hkv=st.integers(1, 2), G=st.sampled_from(GROUPS),
       P=st.sampled_from(LEN_CAPACITIES), dtype=st.sampled_from(DTYPES), one_pass=st.booleans(), data=st.data(),
       seed=st.integers(0, 2**31 - 1), **LEN_ARGS)
def test_branch_attention_prefix_len(N, B, Hkv, G, P, dtype, one_pass, data, seed, shape, len_dtype):
    L = draw_len(data, P)
    gen = torch.Generator().manual_seed(seed)
    D = 16
    q = randn(N, B, Hkv * G, D, dtype=dtype, gen=gen)
    k = randn(N, B, Hkv, D, dtype=dtype, gen=gen)
    v = randn(N, B, Hkv, D, dtype=dtype, gen=gen)
    k_pre, v_pre = cache_view(Hkv, P, D, dtype, gen)
    tuning = ATT if one_pass else attention_tuning(one_pass_max_prefix=-1)
    out = branch_attention(q, k, v, k_pre, v_pre, 0.25, prefix_len=prefix_len_tensor(L, shape, len_dtype),
                           tuning=tuning)
    ref = branch_attention_ref(q, k, v, k_pre[:, :L], v_pre[:, :L], 0.25)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), ref.float(), **tol(dtype))


@settings(deadline=None, max_examples=50)
@given(R=st.integers(1, 6), Hkv=st.integers(1, 2), G=st.sampled_from(GROUPS), P=st.sampled_from([0] + LEN_CAPACITIES),
       data=st.data(), seed=st.integers(0, 2**31 - 1), **LEN_ARGS)
def test_refs_prefix_len_mask_equals_slice(R, Hkv, G, P, data, seed, shape, len_dtype):
    """The references mask the keys past the length (no slicing, no host read): the same as the sliced
    prefix, an all-masked prefix being the empty state (0, -inf) with no NaN."""
    L = draw_len(data, P)
    gen = torch.Generator().manual_seed(seed)
    plen = prefix_len_tensor(L, shape, len_dtype)
    q = strided_q(R, Hkv * G, 8, torch.float32, gen)
    k_pre, v_pre = cache_view(Hkv, P, 8, torch.float32, gen)
    o, lse = prefix_attention_ref(q, k_pre, v_pre, 0.3, prefix_len=plen)
    o_ref, lse_ref = prefix_attention_ref(q, k_pre[:, :L], v_pre[:, :L], 0.3)
    torch.testing.assert_close(o, o_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-6, atol=1e-6)
    if min(L, P) == 0:
        assert torch.all(o == 0) and torch.all(lse == float("-inf"))
    qb = randn(2, 3, Hkv * G, 8, gen=gen)
    kb = randn(2, 3, Hkv, 8, gen=gen)
    vb = randn(2, 3, Hkv, 8, gen=gen)
    out = branch_attention_ref(qb, kb, vb, k_pre, v_pre, 0.3, prefix_len=plen)
    assert not out.isnan().any()
    torch.testing.assert_close(out, branch_attention_ref(qb, kb, vb, k_pre[:, :L], v_pre[:, :L], 0.3),
                               rtol=1e-6, atol=1e-6)


class _NoHostRead(torch.Tensor):
    """A length whose value the host may not read (a CUDA graph replays with another value in it)."""

    def item(self):
        raise AssertionError("prefix_len was read on the host")

    __int__ = __index__ = __bool__ = __float__ = tolist = numpy = item


@pytest.mark.parametrize("fn", ["prefix_attention_states", "prefix_attention", "one_pass", "slot: one pass",
                                "slot: two kernels", "branch"])
def test_prefix_len_is_never_read_on_the_host(fn):
    """The launchers check the length's metadata only and pass it to the kernels as it is."""
    gen = torch.Generator().manual_seed(13)
    L, P = 6, 17
    plen = torch.tensor(L, device=DEVICE).as_subclass(_NoHostRead)
    q, k, v, k_pre, v_pre, slot = packed_problem(2, 3, 1, 2, 8, P, torch.float32, 0.5, gen)
    tuning = attention_tuning(one_pass_max_prefix=-1) if fn == "slot: two kernels" else ATT
    if fn.startswith("prefix_attention"):
        call = prefix_attention_states if fn == "prefix_attention_states" else prefix_attention
        out = merge_split_states(*call(q, k_pre, v_pre, 0.3, prefix_len=plen, tuning=tuning)) \
            if call is prefix_attention_states \
            else call(q, k_pre, v_pre, 0.3, prefix_len=plen)
        ref = prefix_attention_ref(q, k_pre[:, :L], v_pre[:, :L], 0.3)
    elif fn == "branch":
        qb, kb, vb = q[:6].reshape(2, 3, 2, 8), k[:6].reshape(2, 3, 1, 8), v[:6].reshape(2, 3, 1, 8)
        out = branch_attention(qb, kb, vb, k_pre, v_pre, 0.3, prefix_len=plen, tuning=tuning)
        ref = branch_attention_ref(qb, kb, vb, k_pre[:, :L], v_pre[:, :L], 0.3)
    else:
        call = one_pass_attention if fn == "one_pass" else slot_attention
        extra = {} if call is one_pass_attention else {"tuning": tuning}
        out = call(q, k, v, slot, k_pre, v_pre, 0.3, prefix_len=plen, **extra)
        ref = block_attention_ref(q, k, v, slot, *prefix_attention_ref(q, k_pre[:, :L], v_pre[:, :L], 0.3), 0.3)
    torch.testing.assert_close(out, ref, **tol(torch.float32))


@pytest.mark.parametrize("fn", ["prefix_attention_states", "prefix_attention", "one_pass", "slot", "branch"])
def test_prefix_len_rejects_bad_lengths(fn):
    """Not a tensor, not an integer dtype, not one element, not on q's device: an error naming prefix_len,
    before any launch."""
    gen = torch.Generator().manual_seed(14)
    q, k, v, k_pre, v_pre, slot = packed_problem(2, 3, 1, 2, 8, 5, torch.float32, 0.0, gen)
    calls = {
        "prefix_attention_states": lambda pl: prefix_attention_states(q, k_pre, v_pre, 0.3, prefix_len=pl),
        "prefix_attention": lambda pl: prefix_attention(q, k_pre, v_pre, 0.3, prefix_len=pl),
        "one_pass": lambda pl: one_pass_attention(q, k, v, slot, k_pre, v_pre, 0.3, prefix_len=pl),
        "slot": lambda pl: slot_attention(q, k, v, slot, k_pre, v_pre, 0.3, prefix_len=pl, tuning=ATT),
        "branch": lambda pl: branch_attention(q[:6].reshape(2, 3, 2, 8), k[:6].reshape(2, 3, 1, 8),
                                              v[:6].reshape(2, 3, 1, 8), k_pre, v_pre, 0.3, prefix_len=pl,
                                              tuning=ATT),
    }
    for bad in (3, torch.tensor(3.0, device=DEVICE), torch.tensor(3, dtype=torch.int16, device=DEVICE),
                torch.tensor([3, 4], device=DEVICE), torch.tensor([[3]], device=DEVICE),
                torch.tensor(3, device="meta")):
        with pytest.raises((ValueError, TypeError), match="^prefix_len: expected"):
            calls[fn](bad)
