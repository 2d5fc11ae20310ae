from unittest import mock

import pytest
import torch
from hypothesis import given, settings, strategies as st

pytest.importorskip("triton")

from specfold_compile.kernels import gate  # noqa: E402
from specfold_compile.kernels import (fold_gate, fold_gate_from_flags, fold_gate_ref, resolve_folds,  # noqa: E402
                                     resolve_folds_ref)
from specfold_compile.kernels.gate_ref import (FoldChains, chain_depth, fold_flags_ref,  # noqa: E402
                                               fold_gate_from_flags_ref, fold_test, resolve_folds_jump)
from specfold_compile.testing import DEVICE, DTYPES, no_host_reads, randn  # noqa: E402

SETTINGS = dict(deadline=None, max_examples=12)


def random_parents(N, gen, chain=False):
    par = [-1]
    for n in range(1, N):
        par.append(n - 1 if chain else int(torch.randint(0, n, (1,), generator=gen)))
    return torch.tensor(par, dtype=torch.int64, device=DEVICE)


def gated_h(N, B, C, parents, tau, fold_prob, dtype, gen):
    """h whose gate ratios ||h-h_p|| / ||h_p|| are 0.3*tau (fold) or 3*tau (keep): far from the
    threshold, so rounding never flips a decision."""
    h = torch.empty(N, B, C)
    h[0] = torch.randn(B, C, generator=gen)
    par = parents.cpu()
    for n in range(1, N):
        hp = h[par[n]]
        u = torch.randn(B, C, generator=gen)
        u = u / u.norm(dim=-1, keepdim=True)
        fold = torch.rand(B, 1, generator=gen) < fold_prob
        r = torch.where(fold, torch.full_like(fold, 0.3 * tau, dtype=torch.float32),
                        torch.full_like(fold, 3.0 * tau + 0.5, dtype=torch.float32))
        h[n] = hp + r * hp.norm(dim=-1, keepdim=True) * u
    return h.to(device=DEVICE, dtype=dtype)


def check_gate(h, parents, tau):
    out = fold_gate(h, parents, tau)
    ref = fold_gate_ref(h, parents, tau)
    names = ["fold", "origin", "rows", "count", "slot"]
    for name, a, b in zip(names, out, ref):
        assert a.dtype == b.dtype, name
        assert a.shape == b.shape, name
        assert torch.equal(a.cpu(), b.cpu()), f"{name}: {a} vs {b}"
    return out


@settings(**SETTINGS)
@given(N=st.integers(1, 9), B=st.integers(1, 9), C=st.integers(1, 40),
       fold_prob=st.sampled_from([0.0, 0.5, 1.0]), chain=st.booleans(),
       dtype=st.sampled_from(DTYPES), tau=st.floats(0.05, 0.5), seed=st.integers(0, 2**31 - 1))
def test_fold_gate_matches_ref(N, B, C, fold_prob, chain, dtype, tau, seed):
    gen = torch.Generator().manual_seed(seed)
    parents = random_parents(N, gen, chain)
    h = gated_h(N, B, C, parents, tau, fold_prob, dtype, gen)
    tau_t = torch.tensor(tau, dtype=torch.float32, device=DEVICE)
    fold, origin, rows, count, slot = check_gate(h, parents, tau_t)
    if fold_prob == 1.0:
        assert int(count) == B  # only row 0 computed
    if fold_prob == 0.0:
        assert int(count) == N * B


def test_fold_gate_large_C_and_pow2_B():
    gen = torch.Generator().manual_seed(1)
    N, B, C = 5, 32, 1100  # C over one chunk, odd
    parents = random_parents(N, gen)
    h = gated_h(N, B, C, parents, 0.1, 0.5, torch.float32, gen)
    check_gate(h, parents, torch.tensor(0.1, device=DEVICE))


@settings(**SETTINGS)
@given(N=st.integers(1, 6), B=st.integers(1, 6), C=st.integers(1, 40), block_rows=st.sampled_from([1, 2, 4]),
       block_c=st.sampled_from([4, 8, 16]), fold_prob=st.sampled_from([0.0, 0.5, 1.0]), seed=st.integers(0, 2**31 - 1))
def test_fold_flags_in_chunks_match_ref(N, B, C, block_rows, block_c, fold_prob, seed):
    """Rows longer than the flag launch's chunk (several chunks, the last one whole or ragged) decide as
    the reference does; the default config takes a row in one chunk up to 4096 channels."""
    gen = torch.Generator().manual_seed(seed)
    parents = random_parents(N, gen)
    h = gated_h(N, B, C, parents, 0.1, fold_prob, torch.float32, gen)
    with mock.patch.object(gate, "flag_config", lambda _c: (block_rows, block_c, 1)):
        check_gate(h, parents, torch.tensor(0.1, device=DEVICE))


@pytest.mark.parametrize("C", [1, 48, 1000, 1536, 3584, 4096, 4097, 8192])
def test_flag_config_bounds(C):
    """Powers of two; a whole row in one chunk up to 4096 channels; at most 8192 elements a program."""
    block_rows, block_c, warps = gate.flag_config(C)
    assert all(v > 0 and v & (v - 1) == 0 for v in (block_rows, block_c, warps))
    assert block_c >= min(C, 4096) and block_rows * block_c <= 8192


def test_fold_gate_chain_all_folded():
    gen = torch.Generator().manual_seed(2)
    N, B, C = 8, 4, 16
    parents = random_parents(N, gen, chain=True)
    h = gated_h(N, B, C, parents, 0.2, 1.0, torch.float32, gen)
    fold, origin, rows, count, slot = check_gate(h, parents, torch.tensor(0.2, device=DEVICE))
    assert fold[1:].all() and not fold[0].any()
    assert torch.equal(origin.cpu(), torch.arange(B).expand(N, B))
    assert int(count) == B


def test_edge_cases_tau0_nan_zero_parent():
    gen = torch.Generator().manual_seed(3)
    N, B, C = 4, 3, 8
    parents = torch.tensor([-1, 0, 1, 1], device=DEVICE)
    h = randn(N, B, C, gen=gen)
    # tau = 0 folds nothing, even identical rows
    h0 = h.clone()
    h0[1] = h0[0]
    fold, *_ = check_gate(h0, parents, torch.tensor(0.0, device=DEVICE))
    assert not fold.any()
    # identical rows fold for tau > 0 ...
    tau = torch.tensor(0.5, device=DEVICE)
    fold, *_ = check_gate(h0, parents, tau)
    assert fold[1].all()
    # ... but not when the parent row is zero (0 < 0 is false) ...
    hz = h0.clone()
    hz[0, 1] = 0.0
    hz[1, 1] = 0.0
    fold, *_ = check_gate(hz, parents, tau)
    assert not fold[1, 1] and fold[1, 0]
    # ... nor when a NaN appears in the row or its parent
    hn = h0.clone()
    hn[1, 0, 3] = float("nan")
    hn[2] = hn[1]  # row 2 equals its parent row 1; b=0 has NaN
    fold, *_ = check_gate(hn, parents, tau)
    assert not fold[1, 0] and not fold[2, 0]
    assert fold[2, 1] and fold[2, 2]


@settings(deadline=None, max_examples=20)
@given(N=st.integers(1, 12), B=st.integers(1, 12), p_fold=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
       chain=st.booleans(), in_registers=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_resolve_folds_matches_ref(N, B, p_fold, chain, in_registers, seed):
    """Both ways of pointer jumping (in registers, or through global memory for tiles past
    ``REGISTER_TILE_MAX``) equal the reference."""
    gen = torch.Generator().manual_seed(seed)
    parents = random_parents(N, gen, chain)
    fold = (torch.rand(N, B, generator=gen) < p_fold).to(DEVICE)
    fold[0] = torch.rand(B, generator=gen) < 0.5  # row 0 must be ignored
    with mock.patch.object(gate, "REGISTER_TILE_MAX", gate.REGISTER_TILE_MAX if in_registers else 0):
        out = resolve_folds(fold, parents)
    ref = resolve_folds_ref(fold, parents)
    for a, b in zip(out, ref):
        assert torch.equal(a.cpu(), b.cpu())


@settings(deadline=None, max_examples=40)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5), B=st.integers(1, 8), p_fold=st.floats(0, 1),
       p_invalid=st.sampled_from([0.0, 0.2]), seed=st.integers(0, 2**31 - 1))
def test_resolve_folds_jump_matches_ref(sizes, B, p_fold, p_invalid, seed):
    """The tensor-op resolve equals the row walk on the concatenated rows of several requests (each
    request's rows parented within it, its first row parentless), invalid parents included."""
    gen = torch.Generator().manual_seed(seed)
    parents, start = [], 0
    for n_rows in sizes:
        for n in range(n_rows):
            if n == 0 or float(torch.rand((), generator=gen)) < p_invalid:
                parents.append(-1 if n == 0 else start + n + int(torch.randint(0, 3, (1,), generator=gen)))
            else:
                parents.append(start + int(torch.randint(0, n, (1,), generator=gen)))
        start += n_rows
    host_parents = parents
    parents = torch.tensor(parents, dtype=torch.int64, device=DEVICE)
    fold = (torch.rand(start, B, generator=gen) < p_fold).to(DEVICE)
    ref = resolve_folds_ref(fold, parents)
    for a, b in zip(resolve_folds_jump(fold, parents), ref):
        assert torch.equal(a.cpu(), b.cpu())
    # the chains of the forward, with the depth its host parents give (fewer rounds): the same packing
    chains = FoldChains(parents, B, chain_depth(host_parents))
    assert chains.rounds <= max(start - 2, 0).bit_length()
    rows, slot = chains.pack(fold)
    assert torch.equal(rows.cpu(), ref[1][: int(ref[2])].cpu()) and torch.equal(slot.cpu(), ref[3].cpu())
    h = randn(start, B, 8, gen=gen).cpu()
    near = chains.parent.cpu()[1::2]
    h[1::2] = h[near] * (1 + 0.01 * torch.rand(B, 1, generator=gen))  # every other row near its parent
    tau = torch.tensor(0.05)
    assert torch.equal(chains.flags(h.to(DEVICE), tau).cpu(), fold_flags_ref(h, parents.cpu(), tau))
    loose = fold_test(h.to(DEVICE), chains.parent, tau)  # differs on rows of no valid parent only
    assert torch.equal((loose & chains.valid[:, None]).cpu(), fold_flags_ref(h, parents.cpu(), tau))


def test_chain_depth():
    assert chain_depth([]) == 0 and chain_depth([-1]) == 0
    assert chain_depth([-1, 0, 1, 2, -1, 4]) == 3  # 3 -> 2 -> 1 -> 0
    assert chain_depth([-1, 0, 0, 5, 1]) == 2      # row 3's parent is invalid (not earlier): it starts no chain


def test_resolve_folds_jump_reads_nothing_back():
    """The tensor-op resolve runs under a guard that fails on any host read (the gate's one read, the
    packed count, is the caller's)."""
    gen = torch.Generator().manual_seed(3)
    parents = random_parents(40, gen)
    fold = (torch.rand(40, 6, generator=gen) < 0.5).to(DEVICE)
    with no_host_reads():
        out = resolve_folds_jump(fold, parents)
    for a, b in zip(out, resolve_folds_ref(fold, parents)):
        assert torch.equal(a.cpu(), b.cpu())


def test_resolve_folds_jump_long_chain():
    """A chain of 200 rows all folded: every origin is row 0's position, after 8 rounds of jumping."""
    N, B = 200, 3
    parents = torch.arange(-1, N - 1, device=DEVICE)
    fold = torch.ones(N, B, dtype=torch.bool, device=DEVICE)
    origin, rows, count, slot = resolve_folds_jump(fold, parents)
    assert int(count) == B and torch.equal(origin.cpu(), torch.arange(B).expand(N, B))
    assert torch.equal(slot.cpu(), torch.arange(B).expand(N, B)) and torch.equal(rows[:B].cpu(), torch.arange(B))


def test_resolve_folds_max_shape():
    gen = torch.Generator().manual_seed(4)
    N, B = 64, 64
    parents = random_parents(N, gen)
    fold = (torch.rand(N, B, generator=gen) < 0.8).to(DEVICE)
    for a, b in zip(resolve_folds(fold, parents), resolve_folds_ref(fold, parents)):
        assert torch.equal(a.cpu(), b.cpu())


@settings(deadline=None, max_examples=40)
@given(N=st.integers(1, 10), B=st.integers(1, 10), p=st.floats(0, 1), seed=st.integers(0, 2**31 - 1))
def test_ref_invariants(N, B, p, seed):
    gen = torch.Generator().manual_seed(seed)
    parents = random_parents(N, gen)
    fold = torch.rand(N, B, generator=gen) < p
    origin, rows, count, slot = resolve_folds_ref(fold, parents)
    c = int(count)
    computed = ~fold.clone()
    computed[0] = True
    assert c == int(computed.sum())
    assert torch.equal(rows[slot], origin)
    assert torch.all(rows[:c][1:] > rows[:c][:-1]) if c > 1 else True
    assert torch.all(rows[c:] == 0)
    flat = torch.arange(N * B).view(N, B)
    assert torch.equal(origin[computed], flat[computed])
    # every origin is a computed row, reached along the parent chain of the same lane
    assert computed.view(-1)[origin.view(-1)].all()
    assert torch.equal(origin % B, flat % B)


def test_fold_flags_ref_semantics():
    h = torch.tensor([[[3.0, 4.0]], [[3.0, 4.4]], [[3.0, 4.6]]])
    par = torch.tensor([-1, 0, 0])
    # ||diff|| = 0.4, 0.6 ; ||parent|| = 5 ; tau*5 = 0.5
    f = fold_flags_ref(h, par, torch.tensor(0.1))
    assert f.tolist() == [[False], [True], [False]]


@settings(deadline=None, max_examples=15)
@given(N=st.integers(1, 12), B=st.integers(1, 12), p_fold=st.sampled_from([0.0, 0.4, 1.0]),
       chain=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_fold_gate_from_flags_matches_ref(N, B, p_fold, chain, seed):
    """Flags computed elsewhere (options["gate_flags"]="graph"): one launch gives the gate's own mask
    (row 0 cleared, a new tensor) and the same origin / rows / count / slot as the reference."""
    gen = torch.Generator().manual_seed(seed)
    parents = random_parents(N, gen, chain)
    flags = (torch.rand(N, B, generator=gen) < p_fold).to(DEVICE)
    flags[0] = torch.rand(B, generator=gen) < 0.5  # row 0 must come out unfolded
    fold, *rest = fold_gate_from_flags(flags, parents)
    expected = flags.clone()
    expected[0] = False
    assert fold.dtype == torch.bool and torch.equal(fold.cpu(), expected.cpu())
    assert fold.data_ptr() != flags.data_ptr()
    for a, b in zip(rest, resolve_folds_ref(expected, parents)):
        assert torch.equal(a.cpu(), b.cpu())


@settings(deadline=None, max_examples=20)
@given(N=st.integers(1, 12), B=st.integers(1, 12), p_fold=st.sampled_from([0.0, 0.4, 1.0]), chain=st.booleans(),
       p_row=st.sampled_from([0.0, 0.3, 1.0]), share=st.floats(0.0, 1.2), flag_set=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_fold_gate_from_flags_rows_and_capacity_match_ref(N, B, p_fold, chain, p_row, share, flag_set, seed):
    """The serving engine's gate in one launch: rows folded whole (``fold_rows``), the slots clamped to
    ``capacity - 1`` and the overflow flag set when more positions are computed, never cleared; the
    same as the reference, the unclamped outputs as without a capacity."""
    gen = torch.Generator().manual_seed(seed)
    parents = random_parents(N, gen, chain)
    flags = (torch.rand(N, B, generator=gen) < p_fold).to(DEVICE)
    fold_rows = (torch.rand(N, generator=gen) < p_row).to(DEVICE)
    capacity = max(1, int(share * N * B))
    flag, flag_ref = (torch.full((), flag_set, dtype=torch.bool, device=DEVICE) for _ in range(2))
    out = fold_gate_from_flags(flags, parents, fold_rows=fold_rows, capacity=capacity, overflow_flag=flag)
    ref = fold_gate_from_flags_ref(flags, parents, fold_rows=fold_rows, capacity=capacity, overflow_flag=flag_ref)
    for name, a, b in zip(["fold", "origin", "rows", "count", "slot"], out, ref):
        assert a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu()), f"{name}: {a} vs {b}"
    count = int(out[3])
    assert bool(flag) == bool(flag_ref) == (flag_set or count > capacity)
    assert int(out[4].max()) <= capacity - 1
    folded = out[0].cpu()
    assert all(folded[n].all() for n in range(1, N) if fold_rows[n])  # (every row's parent is valid here)
    plain = fold_gate_from_flags(folded.to(DEVICE), parents)  # the same mask without the options
    for name, a, b in zip(["fold", "origin", "rows", "count"], out[:4], plain[:4]):
        assert torch.equal(a.cpu(), b.cpu()), name
    assert torch.equal(out[4].cpu(), plain[4].clamp(max=capacity - 1).cpu())


@settings(**SETTINGS)
@given(N=st.integers(1, 9), B=st.integers(1, 6), C=st.integers(1, 40), fold_prob=st.sampled_from([0.0, 0.5, 1.0]),
       chain=st.booleans(), tau=st.sampled_from([0.0, 0.05, 0.3]), seed=st.integers(0, 2**31 - 1))
def test_fold_flags_graph_matches_ref(N, B, C, fold_prob, chain, tau, seed):
    """options["gate_flags"]="graph" computes the flags with plain tensor ops: the same decisions as the
    reference, edge cases included (tau = 0, a zero parent row, NaN in a row or its parent)."""
    from specfold_compile.ops.fold_ops import fold_flags_graph

    gen = torch.Generator().manual_seed(seed)
    parents = random_parents(N, gen, chain)
    h = gated_h(N, B, C, parents, max(tau, 0.05), fold_prob, torch.float32, gen)
    if N > 1:
        h[0, 0] = 0.0                                    # a zero parent row never folds its children
        h[N - 1, B - 1, C // 2] = float("nan")           # NaN never folds (nor do its children)
    tau_t = torch.tensor(tau, dtype=torch.float32, device=DEVICE)
    got = fold_flags_graph(h, parents, tau_t)
    assert got.dtype == torch.bool and not got[0].any()
    assert torch.equal(got.cpu(), fold_flags_ref(h, parents, tau_t).cpu())


# --- invalid parents: such a row folds nothing, nothing is read through it, and a flag says so ---------

def corrupt_parents(parents, gen, bad_rows):
    """parents with ``bad_rows`` (row indices) set to invalid values: negative, >= own row, past N, huge."""
    out = parents.clone().cpu()
    n = out.shape[0]
    choices = [-1, -2, -(n + 3), n, n + 5, 2 ** 40]
    for r in bad_rows:
        pick = [c for c in choices + [r] if not (r >= 1 and 0 <= c < r) and not (r == 0 and c == -1)]
        out[r] = pick[int(torch.randint(0, len(pick), (1,), generator=gen))]
    return out.to(DEVICE)


def expected_invalid(parents) -> bool:
    values = parents.cpu().tolist()
    return values[0] != -1 or any(not 0 <= p < n for n, p in enumerate(values) if n >= 1)


@settings(**SETTINGS)
@given(N=st.integers(1, 9), B=st.integers(1, 9), C=st.integers(1, 24), dtype=st.sampled_from(DTYPES),
       n_bad=st.integers(0, 3), flags=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_fold_gate_with_invalid_parents_matches_ref(N, B, C, dtype, n_bad, flags, seed):
    gen = torch.Generator().manual_seed(seed)
    valid = random_parents(N, gen)
    h = gated_h(N, B, C, valid, 0.3, 0.7, dtype, gen)  # most rows would fold onto their valid parent
    bad_rows = torch.randperm(N, generator=gen)[:n_bad].tolist()
    parents = corrupt_parents(valid, gen, bad_rows)
    tau = torch.tensor(0.3, device=DEVICE)
    flag, flag_ref = (torch.zeros(1, dtype=torch.int32, device=DEVICE) for _ in range(2))
    if flags:  # the gate on flags computed elsewhere: every row asks to fold
        ask = torch.ones(N, B, dtype=torch.bool, device=DEVICE)
        out = fold_gate_from_flags(ask, parents, flag)
        ref = (ask & torch.tensor([n >= 1 and 0 <= p < n for n, p in enumerate(parents.tolist())],
                                  device=DEVICE)[:, None],) + resolve_folds_ref(ask, parents, flag_ref)
    else:
        out = fold_gate(h, parents, tau, flag)
        ref = fold_gate_ref(h, parents, tau, flag_ref)
    for name, a, b in zip(["fold", "origin", "rows", "count", "slot"], out, ref):
        assert torch.equal(a.cpu(), b.cpu()), f"{name}: {a} vs {b}"
    assert int(flag) == int(flag_ref) == int(expected_invalid(parents))
    fold, origin = out[0].cpu(), out[1].cpu()
    for r in bad_rows:
        if r >= 1:
            assert not fold[r].any(), "a row with an invalid parent folded"
            assert torch.equal(origin[r], torch.arange(r * B, (r + 1) * B)), "an invalid row reads another"
    assert int(origin.min()) >= 0 and int(origin.max()) < N * B


def test_invalid_flag_is_sticky_and_checked():
    parents = torch.tensor([-1, 0, 1], device=DEVICE)
    fold = torch.ones(3, 4, dtype=torch.bool, device=DEVICE)
    flag = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    resolve_folds(fold, torch.tensor([-1, 2, 1], device=DEVICE), flag)
    assert int(flag) == 1
    resolve_folds(fold, parents, flag)  # valid parents never clear it
    assert int(flag) == 1
    with pytest.raises(ValueError, match="^invalid_flag: expected"):
        resolve_folds(fold, parents, torch.zeros(1, dtype=torch.int64, device=DEVICE))
