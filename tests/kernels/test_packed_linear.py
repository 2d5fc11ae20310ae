import pytest
import torch
from hypothesis import given, settings, strategies as st

pytest.importorskip("triton")

from specfold_compile.kernels import packed_linear, packed_linear_ref  # noqa: E402
from specfold_compile.testing import DEVICE, DTYPES, randn, tol  # noqa: E402


@settings(deadline=None, max_examples=30)
@given(R=st.integers(1, 40), K=st.integers(1, 70), M=st.integers(1, 70), bias=st.booleans(),
       three_d=st.booleans(), strided=st.booleans(),
       count_mode=st.sampled_from(["none", "zero", "all", "mid"]),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_packed_linear(R, K, M, bias, three_d, strided, count_mode, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    if strided:
        x = randn(R, K + 5, dtype=dtype, gen=gen)[:, 3:K + 3]   # row stride K+5
    else:
        x = randn(R, K, dtype=dtype, gen=gen)
    if three_d:
        x = x.unsqueeze(1)                                       # [R, 1, K]
    w = randn(M, K, dtype=dtype, gen=gen, scale=K ** -0.5)
    b = randn(M, dtype=dtype, gen=gen) if bias else None
    c = {"none": R, "zero": 0, "all": R, "mid": int(torch.randint(1, R + 1, (1,), generator=gen))}[count_mode]
    count = None if count_mode == "none" else torch.tensor(c, dtype=torch.int64, device=DEVICE)
    y = packed_linear(x, w, b, count, min_block_r=64)
    ref = packed_linear_ref(x, w, b)
    assert y.dtype == dtype and y.shape == x.shape[:-1] + (M,)
    y2 = y.reshape(R, M)
    torch.testing.assert_close(y2[:c].float(), ref.reshape(R, M)[:c].float(), **tol(dtype))


def test_packed_linear_count_zero_writes_nothing():
    gen = torch.Generator().manual_seed(1)
    x = randn(20, 33, gen=gen)
    w = randn(17, 33, gen=gen)
    y = packed_linear(x, w, None, torch.tensor(0, device=DEVICE), min_block_r=64)
    if DEVICE == "cpu":  # outputs are poisoned with NaN by conftest: nothing was written
        assert torch.isnan(y).all()


def test_packed_linear_skips_tiles_beyond_count():
    gen = torch.Generator().manual_seed(2)
    x = randn(64, 32, gen=gen)
    w = randn(48, 32, gen=gen)
    y = packed_linear(x, w, None, torch.tensor(17, device=DEVICE), min_block_r=64)
    torch.testing.assert_close(y[:17], packed_linear_ref(x, w, None)[:17], **tol(torch.float32))
    if DEVICE == "cpu":  # row tiles of 16 under the interpreter: tiles from row 32 on never ran
        assert torch.isnan(y[32:]).all()


@settings(deadline=None, max_examples=20)
@given(R=st.integers(1, 40), K=st.integers(1, 40), M=st.integers(1, 40), bias=st.booleans(),
       dense_fraction=st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0]), multiple=st.sampled_from([1, 4, 16]),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1),
       min_spill_us=st.sampled_from([0.0, 0.0, 2.0]))
def test_packed_linear_op_cublas_head_and_triton_spill(R, K, M, bias, dense_fraction, multiple, dtype, seed,
                                                       min_spill_us):
    """fold_ops.packed_linear (Triton impl): cuBLAS on the first dense_rows(R) rows, the count-aware
    kernel on the rest; every row below count must match the reference wherever the split falls."""
    from specfold_compile.ops import fold_ops

    _check_packed_linear_op(fold_ops, R, K, M, bias, dense_fraction, multiple, dtype, seed, min_spill_us)


def _check_packed_linear_op(fold_ops, R, K, M, bias, dense_fraction, multiple, dtype, seed, min_spill_us=0.0):
    gen = torch.Generator().manual_seed(seed)
    x = randn(R, 1, K, dtype=dtype, gen=gen)
    w = randn(M, K, dtype=dtype, gen=gen, scale=K ** -0.5)
    b = randn(M, dtype=dtype, gen=gen) if bias else None
    c = int(torch.randint(0, R + 1, (1,), generator=gen))
    from specfold_compile.ops.device_profile import H200

    # tiny shapes: a cuBLAS head of any multiple of ``multiple`` rows, from 0 on
    y = fold_ops.packed_linear(x, w, b, torch.tensor(c, device=DEVICE), dense_fraction, "triton", min_spill_us,
                               dense_linear_min_rows=0, dense_linear_row_multiple=multiple)
    costs = H200.replace(dense_linear_min_rows=0, dense_linear_row_multiple=multiple)
    head = fold_ops.dense_rows(R, dense_fraction, (M, K), min_spill_us, x.element_size(), costs)
    if min_spill_us > 0:  # these weights are tiny: the whole GEMM costs less than a spill launch
        assert head == R
    assert 0 <= head <= R and (head == R or head % multiple == 0)
    assert y.shape == (R, 1, M) and y.dtype == dtype
    ref = packed_linear_ref(x, w, b)
    torch.testing.assert_close(y[:max(c, head)].float(), ref[:max(c, head)].float(), **tol(dtype))


def test_dense_rows_rule():
    from specfold_compile.ops import fold_ops

    assert fold_ops.dense_rows(160, 0.3) == 128          # never below the profile's dense_linear_min_rows
    assert fold_ops.dense_rows(544, 0.3) == 192          # 163.2 -> next multiple of 64
    assert fold_ops.dense_rows(1056, 0.3) == 320
    assert fold_ops.dense_rows(100, 0.3) == 100          # capped at the row count
    assert fold_ops.dense_rows(544, 1.0) == 544
    assert fold_ops.dense_rows(544, 0.0) == 128


def test_dense_rows_skips_spills_cheaper_than_a_launch():
    from specfold_compile.ops import fold_ops

    rows, frac = 544, 0.45  # N = 17: a 256-row head
    assert fold_ops.dense_rows(rows, frac, (256, 256), 0.0) == 256        # off by default
    assert fold_ops.dense_rows(rows, frac, (256, 256), 2.0) == rows       # tiny model: ~0.1 us of GEMM
    assert fold_ops.dense_rows(rows, frac, (256, 1536), 2.0) == rows      # 1.5B k/v: +0.3 us
    assert fold_ops.dense_rows(rows, frac, (1536, 1536), 2.0) == rows     # 1.5B q: +1.7 us
    assert fold_ops.dense_rows(rows, frac, (8960, 1536), 2.0) == 256      # 1.5B gate/up: +10 us
    assert fold_ops.dense_rows(rows, frac, (3584, 3584), 2.0) == 256      # 7B q/o: +9.3 us
    assert fold_ops.dense_rows(1056, frac, (1536, 1536), 2.0) == 512      # 1.5B q at N = 33: +3.1 us
    # The estimate itself: weight-read-bound below the ridge, FLOP-bound above it.
    from specfold_compile.ops.device_profile import H200

    assert fold_ops._gemm_us(1, 1536, 1536, 2, H200) == pytest.approx(1536 * 1536 * 2 / 4.3e12 * 1e6)
    assert fold_ops._gemm_us(544, 1536, 1536, 2, H200) == pytest.approx(2 * 544 * 1536 * 1536 / 790e12 * 1e6)
    # another device's roofline moves the decision: at half the bandwidth the 1.5B q head pays a spill
    slow = H200.replace(gemm_bytes_per_s=H200.gemm_bytes_per_s / 2, gemm_flops_per_s=H200.gemm_flops_per_s / 8)
    assert fold_ops.dense_rows(rows, frac, (1536, 1536), 2.0, costs=slow) == 256


def test_autotune_hooks_time_real_work_and_restore_the_count():
    """The autotuner's hooks give the timed runs a quarter of the covered rows to compute, then put
    the caller's device-side count back (see _TuneWithWork)."""
    from specfold_compile.kernels.packed_linear import _TuneWithWork

    hooks = _TuneWithWork()
    count = torch.tensor(3, dtype=torch.int64, device=DEVICE)
    kwargs = {"count_ptr": count, "ROW_START": 128, "R": 544, "HAS_COUNT": True}
    hooks.pre(kwargs)
    assert int(count) == 128 + 104
    hooks.post(kwargs)
    assert int(count) == 3
    hooks.pre(kwargs, reset_only=True)  # the autotuner's reset before the real launch: no change
    hooks.pre({**kwargs, "HAS_COUNT": False})
    assert int(count) == 3 and hooks.saved is None


def test_autotune_configs_keep_row_tiles_of_64_rows_or_more():
    """Every row tile reads the whole weight, so by default the tuner only chooses among row tiles of
    >= 64 rows; a smaller bound brings back the older configs, and a bound no config meets is an error
    naming the argument."""
    import importlib

    pl = importlib.import_module("specfold_compile.kernels.packed_linear")
    default = pl._cuda_configs(64)
    assert default and all(c.kwargs["BLOCK_R"] >= 64 for c in default)
    every = pl._cuda_configs(16)
    assert len(every) > len(default) and min(c.kwargs["BLOCK_R"] for c in every) == 16
    for bad in (256, 0, "x"):
        with pytest.raises(ValueError, match="min_block_r"):
            pl._cuda_configs(bad)


def test_min_block_r_bound_is_the_settings_bound():
    """The settings check the bound without importing triton: the same largest row tile as the kernel's."""
    from specfold_compile.backend import _checks
    import importlib

    pl = importlib.import_module("specfold_compile.kernels.packed_linear")

    assert _checks.LARGEST_BLOCK_R == pl.LARGEST_BLOCK_R
    for bad in (0, 129, "64", True):
        with pytest.raises(ValueError, match="^min_block_r: expected"):
            pl.check_min_block_r(bad)
