import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

pytest.importorskip("triton")

from specfold_compile.kernels import (  # noqa: E402
    block_attention, block_attention_ref, branch_attention, branch_attention_ref, merge_split_states, merge_states,
    one_pass_attention, prefix_attention, prefix_attention_ref, prefix_attention_states,
    slot_attention,
)
from specfold_compile.testing import (ATT, DEVICE, DTYPES, attention_tuning, cache_view,  # noqa: E402
                                      packed_problem, randn, strided_q, tol)

SETTINGS = dict(deadline=None, max_examples=25)
GROUPS = [1, 2, 4, 7]


@settings(**SETTINGS)
@given(R=st.integers(1, 9), Hkv=st.integers(1, 2), G=st.sampled_from(GROUPS),
       D=st.sampled_from([8, 16, 24]), P=st.sampled_from([0, 1, 5, 17, 33]),
       dtype=st.sampled_from(DTYPES), count_mode=st.sampled_from(["none", "zero", "all", "mid"]),
       seed=st.integers(0, 2**31 - 1))
def test_prefix_attention(R, Hkv, G, D, P, dtype, count_mode, seed):
    gen = torch.Generator().manual_seed(seed)
    Hq = Hkv * G
    q = strided_q(R, Hq, D, dtype, gen)
    k_pre, v_pre = cache_view(Hkv, P, D, dtype, gen)
    scale = 1.0 / math.sqrt(D)
    c = {"none": R, "zero": 0, "all": R, "mid": R // 2}[count_mode]
    count = None if count_mode == "none" else torch.tensor(c, dtype=torch.int64, device=DEVICE)
    o, lse = prefix_attention(q, k_pre, v_pre, scale, count)
    o_ref, lse_ref = prefix_attention_ref(q, k_pre, v_pre, scale)
    assert o.dtype == torch.float32 and lse.dtype == torch.float32
    assert o.shape == (R, Hq, D) and lse.shape == (R, Hq)
    torch.testing.assert_close(o[:c], o_ref[:c], **tol(dtype))
    if P == 0:
        assert torch.all(o[:c] == 0) and torch.all(lse[:c] == float("-inf"))
    else:
        torch.testing.assert_close(lse[:c], lse_ref[:c], **tol(dtype))


@settings(**SETTINGS)
@given(N=st.integers(1, 5), B=st.integers(1, 9), Hkv=st.integers(1, 2), G=st.sampled_from(GROUPS),
       D=st.sampled_from([8, 16]), P=st.sampled_from([0, 3, 17]), dtype=st.sampled_from(DTYPES),
       p_fold=st.sampled_from([0.0, 0.5, 1.0]), seed=st.integers(0, 2**31 - 1))
def test_block_attention(N, B, Hkv, G, D, P, dtype, p_fold, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, k_pre, v_pre, slot = packed_problem(N, B, Hkv, G, D, P, dtype, p_fold, gen)
    scale = 0.7 / math.sqrt(D)
    o_pre, lse_pre = prefix_attention_ref(q, k_pre, v_pre, scale)
    out = block_attention(q, k, v, slot, o_pre, lse_pre, scale)
    ref = block_attention_ref(q, k, v, slot, o_pre, lse_pre, scale)
    assert out.dtype == q.dtype and out.shape == (N, B, Hkv * G, D)
    torch.testing.assert_close(out.float(), ref.float(), **tol(dtype))


@settings(**SETTINGS)
@given(N=st.integers(1, 4), B=st.integers(1, 40), Hkv=st.integers(1, 2), G=st.sampled_from(GROUPS),
       D=st.sampled_from([8, 16, 24]), P=st.sampled_from([0, 1, 3, 17, 40]), dtype=st.sampled_from(DTYPES),
       p_fold=st.sampled_from([0.0, 0.5, 1.0]),
       config=st.sampled_from([None, (16, 16, 1, 1), (16, 32, 2, 2), (32, 16, 4, 3)]),
       seed=st.integers(0, 2**31 - 1))
def test_one_pass_attention(N, B, Hkv, G, D, P, dtype, p_fold, config, seed):
    """One pass (every row walks the prefix with its origin's query, then its branch's block, in one online
    softmax) equals the reference's prefix state merged with the block state, in any tile config."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, k_pre, v_pre, slot = packed_problem(N, B, Hkv, G, D, P, dtype, p_fold, gen)
    scale = 0.7 / math.sqrt(D)
    out = one_pass_attention(q, k, v, slot, k_pre, v_pre, scale, config=config)
    ref = block_attention_ref(q, k, v, slot, *prefix_attention_ref(q, k_pre, v_pre, scale), scale)
    assert out.dtype == q.dtype and out.shape == (N, B, Hkv * G, D)
    torch.testing.assert_close(out.float(), ref.float(), **tol(dtype))


@pytest.mark.parametrize("N, B, G, P", [(1, 1, 7, 0), (2, 1, 7, 5), (1, 32, 1, 0), (3, 32, 6, 65)])
def test_one_pass_attention_edges(N, B, G, P):
    """Fixed edge cases: an empty prefix (the running max starts at -inf), one-row blocks, a full 32-row
    block, a group of 7 (not a power of two), a prefix longer than a key tile."""
    gen = torch.Generator().manual_seed(N * 1000 + B * 10 + P)
    q, k, v, k_pre, v_pre, slot = packed_problem(N, B, 1, G, 16, P, torch.float32, 0.5, gen)
    out = one_pass_attention(q, k, v, slot, k_pre, v_pre, 0.25)
    ref = block_attention_ref(q, k, v, slot, *prefix_attention_ref(q, k_pre, v_pre, 0.25), 0.25)
    torch.testing.assert_close(out, ref, **tol(torch.float32))


def test_slot_attention_one_pass_only_for_short_prefixes_and_few_rows(monkeypatch):
    """slot_attention runs one pass for at most one_pass_max_prefix prefix keys and a walk of at most
    one_pass_max_work rows x query heads x keys (its AttentionTuning), and prefix states + block merge otherwise; every path gives the
    reference's output, with or without a device-side count."""
    from specfold_compile.kernels import attention as A

    calls = []
    launch = A._launch_block_kernel

    def watched_launch(*a, **kw):  # the one-pass launch is the block kernel's with the prefix to walk
        if kw.get("prefix") is not None:
            calls.append("one")
        return launch(*a, **kw)
    monkeypatch.setattr(A, "_launch_block_kernel", watched_launch)
    gen = torch.Generator().manual_seed(11)
    # (max walk, prefix keys, one pass?) for 3 x 6 = 18 slot rows of 6 query heads
    for max_work, P, one in ((10**9, 0, True), (10**9, 20, True), (10**9, 21, False), (10**9, 33, False),
                             (1, 0, True), (1, 20, False), (18 * 6 * 20, 20, True), (18 * 6 * 20 - 1, 20, False)):
        q, k, v, k_pre, v_pre, slot = packed_problem(3, 6, 2, 3, 16, P, torch.float32, 0.5, gen)
        tuning = attention_tuning(one_pass_max_prefix=20, one_pass_max_work=max_work)
        ref = block_attention_ref(q, k, v, slot, *prefix_attention_ref(q, k_pre, v_pre, 0.3), 0.3)
        for count in (None, torch.tensor(q.shape[0] - 2, device=DEVICE)):
            calls.clear()
            out = slot_attention(q, k, v, slot, k_pre, v_pre, 0.3, count, tuning=tuning)
            assert calls == (["one"] if one else []), (max_work, P, calls)
            torch.testing.assert_close(out, ref, **tol(torch.float32))
    never = attention_tuning(one_pass_max_prefix=-1, one_pass_max_work=10**9)  # the bisection switch
    q, k, v, k_pre, v_pre, slot = packed_problem(2, 4, 1, 2, 16, 0, torch.float32, 0.5, gen)
    calls.clear()
    slot_attention(q, k, v, slot, k_pre, v_pre, 0.3, tuning=never)
    assert calls == []


def test_one_pass_rule_at_the_measured_shapes():
    """The rule's picks where the H200 sweep measured both ways (rows = N * 32; 1.5B 12 query heads, 7B 28):
    one pass at N = 1 and 5 for prefix 512, at N = 1 for 1024 and at 1.5B's N = 5 there; two kernels at
    7B's N = 5 for 1024, at N = 17 and from 2048 keys on (split prefix)."""
    from specfold_compile.kernels.attention import use_one_pass

    for heads in (12, 28):
        assert use_one_pass(32, heads, 512, ATT) and use_one_pass(160, heads, 512, ATT)
        assert use_one_pass(32, heads, 1024, ATT)
        assert not use_one_pass(544, heads, 512, ATT) and not use_one_pass(32, heads, 2048, ATT)
    assert use_one_pass(160, 12, 1024, ATT) and not use_one_pass(160, 28, 1024, ATT)


@pytest.mark.parametrize("fn", ["one_pass", "slot"])
def test_attention_rejects_bad_inputs(fn):
    """Both entry points name the bad argument and what they expected, before any launch (the two-kernel
    path of slot_attention included: a prefix with other kv heads than the block's is an error there too)."""
    gen = torch.Generator().manual_seed(12)
    q, k, v, k_pre, v_pre, slot = packed_problem(2, 4, 2, 2, 8, 5, torch.float32, 0.5, gen)
    call = one_pass_attention if fn == "one_pass" else (lambda *a, config=None: slot_attention(*a, tuning=ATT))
    bad = [(dict(k_pre=k_pre[:1], v_pre=v_pre[:1]), "k_pre"), (dict(k_pre=k_pre[0, 0]), "k_pre"),
           (dict(v_pre=v_pre[:, :3]), "v_pre"), (dict(slot=slot.flatten()), "slot"), (dict(slot=slot.float()), "slot"),
           (dict(k_pre=k_pre.double(), v_pre=v_pre.double()), "k_pre, v_pre"), (dict(v=v.double()), "k, v")]
    if fn == "one_pass":
        bad.append((dict(config=(24, 16, 4, 2)), "config"))
    for change, name in bad:
        args = dict(q=q, k=k, v=v, slot=slot, k_pre=k_pre, v_pre=v_pre)
        config = change.pop("config", None)
        args.update(change)
        with pytest.raises(ValueError, match=name):
            call(args["q"], args["k"], args["v"], args["slot"], args["k_pre"], args["v_pre"], 0.3, config=config)


def test_block_attention_kernel_prefix_state_and_empty_prefix():
    """Kernel prefix state feeding the kernel block attention, including an empty prefix."""
    gen = torch.Generator().manual_seed(5)
    for P in (0, 20):
        q, k, v, k_pre, v_pre, slot = packed_problem(3, 6, 2, 2, 16, P, torch.float32, 0.5, gen)
        count = torch.tensor(q.shape[0] - 2, device=DEVICE)
        o_pre, lse_pre = prefix_attention(q, k_pre, v_pre, 0.25, count)
        out = block_attention(q, k, v, slot, o_pre, lse_pre, 0.25)
        ref = block_attention_ref(q, k, v, slot, *prefix_attention_ref(q, k_pre, v_pre, 0.25), 0.25)
        torch.testing.assert_close(out, ref, **tol(torch.float32))


@settings(deadline=None, max_examples=15)
@given(N=st.integers(1, 4), B=st.integers(1, 8), Hkv=st.integers(1, 2), G=st.sampled_from(GROUPS),
       P=st.sampled_from([0, 1, 9, 21]), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_branch_attention_vs_dense(N, B, Hkv, G, P, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    D = 16
    Hq = Hkv * G
    q = randn(N, B, Hq, D, dtype=dtype, gen=gen)
    k = randn(N, B, Hkv, D, dtype=dtype, gen=gen)
    v = randn(N, B, Hkv, D, dtype=dtype, gen=gen)
    k_pre, v_pre = cache_view(Hkv, P, D, dtype, gen)
    out = branch_attention(q, k, v, k_pre, v_pre, 0.25, tuning=ATT)
    ref = branch_attention_ref(q, k, v, k_pre, v_pre, 0.25)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), ref.float(), **tol(dtype))


def test_branch_attention_128_head_dim():
    gen = torch.Generator().manual_seed(6)
    N, B, Hkv, G, D, P = 2, 4, 1, 2, 128, 19
    q = randn(N, B, Hkv * G, D, gen=gen)
    k = randn(N, B, Hkv, D, gen=gen)
    v = randn(N, B, Hkv, D, gen=gen)
    k_pre, v_pre = cache_view(Hkv, P, D, torch.float32, gen)
    s = 1 / math.sqrt(D)
    torch.testing.assert_close(branch_attention(q, k, v, k_pre, v_pre, s, tuning=ATT),
                               branch_attention_ref(q, k, v, k_pre, v_pre, s), **tol(torch.float32))


def test_ref_merge_equals_dense():
    """Reference consistency: prefix state merged with block state == dense attention."""
    gen = torch.Generator().manual_seed(7)
    N, B, Hkv, G, D, P = 3, 5, 2, 3, 8, 11
    q = randn(N, B, Hkv * G, D, gen=gen)
    k = randn(N, B, Hkv, D, gen=gen)
    v = randn(N, B, Hkv, D, gen=gen)
    k_pre, v_pre = cache_view(Hkv, P, D, torch.float32, gen)
    qf = q.reshape(N * B, Hkv * G, D)
    o_pre, lse_pre = prefix_attention_ref(qf, k_pre, v_pre, 0.3)
    slot = torch.arange(N * B, device=DEVICE).view(N, B)
    merged = block_attention_ref(qf, k.reshape(N * B, Hkv, D), v.reshape(N * B, Hkv, D), slot, o_pre, lse_pre, 0.3)
    torch.testing.assert_close(merged, branch_attention_ref(q, k, v, k_pre, v_pre, 0.3), rtol=1e-5, atol=1e-5)


def test_merge_states_edge_cases():
    gen = torch.Generator().manual_seed(8)
    o1 = randn(4, 3, gen=gen)
    o2 = randn(4, 3, gen=gen)
    l1 = randn(4, gen=gen)
    l2 = randn(4, gen=gen)
    ninf = torch.full((4,), float("-inf"), device=DEVICE)
    zero = torch.zeros(4, 3, device=DEVICE)
    # empty + empty = empty, no NaN (even with garbage outputs in the empty states)
    o, lse = merge_states(torch.full_like(o1, float("nan")), ninf, zero, ninf)
    assert torch.all(o == 0) and torch.all(lse == float("-inf"))
    # empty is the identity
    o, lse = merge_states(o1, l1, zero, ninf)
    torch.testing.assert_close(o, o1)
    torch.testing.assert_close(lse, l1)
    # commutative
    a = merge_states(o1, l1, o2, l2)
    b = merge_states(o2, l2, o1, l1)
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1], b[1])
    # large lse gaps do not overflow
    o, lse = merge_states(o1, l1 + 1000.0, o2, l2)
    torch.testing.assert_close(o, o1)
    assert torch.isfinite(lse).all()


@settings(**SETTINGS)
@given(R=st.integers(1, 9), Hkv=st.integers(1, 2), G=st.sampled_from(GROUPS), D=st.sampled_from([8, 16]),
       P=st.sampled_from([0, 1, 15, 16, 17, 40, 70]), splits=st.integers(1, 6), dtype=st.sampled_from(DTYPES),
       mid_count=st.booleans(), row_tiles_outer=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_prefix_attention_split_states(R, Hkv, G, D, P, splits, dtype, mid_count, row_tiles_outer, seed):
    """Split along the prefix (flash-decoding): the S states merged are the whole prefix's state (splits
    past the end of the prefix are empty states), and the block kernel merging all S states matches
    the reference fed the one-piece state; in either launch order of the flat grid."""
    gen = torch.Generator().manual_seed(seed)
    Hq = Hkv * G
    q = strided_q(R, Hq, D, dtype, gen)
    k_pre, v_pre = cache_view(Hkv, P, D, dtype, gen)
    scale = 1.0 / math.sqrt(D)
    c = R // 2 if mid_count else R
    count = torch.tensor(c, dtype=torch.int64, device=DEVICE) if mid_count else None
    o, lse = prefix_attention_states(q, k_pre, v_pre, scale, count, splits=splits, row_tiles_outer=row_tiles_outer)
    assert o.shape == (splits, R, Hq, D) and lse.shape == (splits, R, Hq)
    o_m, lse_m = merge_split_states(o[:, :c], lse[:, :c])
    o_ref, lse_ref = prefix_attention_ref(q, k_pre, v_pre, scale)
    torch.testing.assert_close(o_m, o_ref[:c], **tol(dtype))
    if P == 0:
        assert torch.all(lse[:, :c] == float("-inf")) and torch.all(o[:, :c] == 0)
    else:
        torch.testing.assert_close(lse_m, lse_ref[:c], **tol(dtype))
    if c == R:
        B = R
        k = randn(R, Hkv, D, dtype=dtype, gen=gen)
        v = randn(R, Hkv, D, dtype=dtype, gen=gen)
        slot = torch.randperm(R, generator=gen).view(1, B).to(DEVICE)
        out = block_attention(q, k, v, slot, o, lse, scale)
        ref = block_attention_ref(q, k, v, slot, o_ref, lse_ref, scale)
        torch.testing.assert_close(out.float(), ref.float(), **tol(dtype))


@settings(deadline=None, max_examples=15)
@given(R=st.integers(1, 9), Hkv=st.integers(1, 2), G=st.sampled_from(GROUPS), P=st.sampled_from([1, 17, 40, 70]),
       block_m=st.sampled_from([16, 32]), block_p=st.sampled_from([16, 32]), warps=st.sampled_from([1, 2, 4]),
       stages=st.sampled_from([1, 2, 3]), splits=st.integers(1, 3), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**31 - 1))
def test_prefix_attention_configs(R, Hkv, G, P, block_m, block_p, warps, stages, splits, dtype, seed):
    """Any (BLOCK_M, BLOCK_P, num_warps, num_stages) the benchmark's sweep may try gives the reference's
    state (the tile shapes only change how rows, heads and keys are walked)."""
    gen = torch.Generator().manual_seed(seed)
    q = strided_q(R, Hkv * G, 16, dtype, gen)
    k_pre, v_pre = cache_view(Hkv, P, 16, dtype, gen)
    o, lse = prefix_attention_states(q, k_pre, v_pre, 0.25, splits=splits, config=(block_m, block_p, warps, stages))
    o_m, lse_m = merge_split_states(o, lse)
    o_ref, lse_ref = prefix_attention_ref(q, k_pre, v_pre, 0.25)
    torch.testing.assert_close(o_m, o_ref, **tol(dtype))
    torch.testing.assert_close(lse_m, lse_ref, **tol(dtype))


def test_prefix_attention_rejects_bad_configs():
    gen = torch.Generator().manual_seed(9)
    q = strided_q(3, 2, 8, torch.float32, gen)
    k_pre, v_pre = cache_view(1, 5, 8, torch.float32, gen)
    for bad in ((64, 64, 4), (48, 64, 4, 2), (64, 8, 4, 2), (64, 64, 3, 2), [64, 64, 4, 2]):
        with pytest.raises(ValueError, match="config"):
            prefix_attention_states(q, k_pre, v_pre, 0.3, config=bad)


def test_prefix_splits_rejects_bad_counts():
    gen = torch.Generator().manual_seed(9)
    q = strided_q(3, 2, 8, torch.float32, gen)
    k_pre, v_pre = cache_view(1, 5, 8, torch.float32, gen)
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match="splits"):
            prefix_attention_states(q, k_pre, v_pre, 0.3, splits=bad)


def test_prefix_split_count_rule(monkeypatch):
    """The split count (host side, from shapes): one split below min_split_prefix keys or off the GPU;
    otherwise at most programs_per_sm working programs an SM, never more splits than key tiles or
    MAX_PREFIX_SPLITS, a count from SPLIT_CHOICES, and neither more programs nor a dearer merge (more
    rows x heads) ever gets more splits."""
    import types

    from specfold_compile.kernels import attention_launch as A

    monkeypatch.setattr(A, "_sm_count", lambda index: 132)
    monkeypatch.setattr(A, "interpreting", lambda: False)
    gpu, cpu = types.SimpleNamespace(type="cuda", index=0), types.SimpleNamespace(type="cpu", index=None)
    assert A.prefix_splits(6, 8192, 64, cpu, tuning=ATT) == 1
    for P in (0, 64, 512, ATT.min_split_prefix - 1):
        assert A.prefix_splits(6, P, 64, gpu, tuning=ATT) == 1
    assert A.prefix_splits(6, 2048, 64, gpu, tuning=ATT) > 1  # few programs, long prefix: split
    for P in (1024, 2048, 4096, 8192, 32768):
        for row_heads in (0, 384, 6528, 15232, 29568):
            last = A.MAX_PREFIX_SPLITS
            for programs in (1, 2, 6, 16, 30, 54, 66, 132, 133, 264, 265, 500):
                s = A.prefix_splits(programs, P, 64, gpu, row_heads, tuning=ATT)
                assert s in A.SPLIT_CHOICES and s <= min(A.MAX_PREFIX_SPLITS, -(-P // 64)) and s <= last
                assert s == 1 or programs * s <= ATT.programs_per_sm * 132
                last = s
        for programs in (6, 30, 72):
            splits = [A.prefix_splits(programs, P, 64, gpu, rh, tuning=ATT) for rh in (0, 6528, 15232, 29568, 10**6)]
            assert splits == sorted(splits, reverse=True), splits


# prefix_len: the prefix cache is a buffer of fixed capacity P whose first L keys are valid, L a device
# tensor (CUDA-graph replays). Every kernel must equal the reference on the sliced prefix k_pre[:, :L].
def test_launch_choices_need_an_attention_tuning():
    """The launchers that choose a path or a split count take the choices as an argument: a missing or
    wrong one is an error naming ``tuning``; with explicit splits the prefix kernel needs none."""
    gen = torch.Generator().manual_seed(15)
    q, k, v, k_pre, v_pre, slot = packed_problem(2, 3, 1, 2, 8, 5, torch.float32, 0.5, gen)
    for bad in (None, {"one_pass_max_prefix": 1}):
        with pytest.raises(ValueError, match="^tuning: expected an AttentionTuning"):
            slot_attention(q, k, v, slot, k_pre, v_pre, 0.3, tuning=bad)
        with pytest.raises(ValueError, match="^tuning: expected an AttentionTuning"):
            prefix_attention_states(q, k_pre, v_pre, 0.3, tuning=bad)
    o, lse = prefix_attention_states(q, k_pre, v_pre, 0.3, splits=1)
    torch.testing.assert_close(o[0], prefix_attention_ref(q, k_pre, v_pre, 0.3)[0], **tol(torch.float32))
