"""bench_count_gemm's split-K head (``split_k_mm``): its timings mean something only if it computes the GEMM.
Against the packed linear's reference on each slice of K, partial sums in the inputs' dtype (the CPU has no
bf16-in, fp32-out batched GEMM), so each partial is rounded once as the benchmark's bf16 variant rounds it."""
import torch
from hypothesis import given, settings, strategies as st

from bench.kernels.bench_count_gemm import split_k_mm
from specfold_compile.kernels import packed_linear_ref
from specfold_compile.testing import DTYPES, randn, tol


@settings(deadline=None, max_examples=30)
@given(rows=st.integers(1, 70), m=st.integers(1, 40), splits=st.sampled_from([1, 2, 3, 4, 8]),
       slice_k=st.sampled_from([8, 16, 24]), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_split_k_mm_matches_reference(rows, m, splits, slice_k, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    k = splits * slice_k
    x = randn(rows, k, dtype=dtype, gen=gen)
    w = randn(m, k, dtype=dtype, gen=gen, scale=k ** -0.5)
    got = split_k_mm(x, w, splits, dtype)
    assert got.dtype == dtype and got.shape == (rows, m)
    slices = [slice(i * slice_k, (i + 1) * slice_k) for i in range(splits)]
    want = sum(packed_linear_ref(x[:, ks], w[:, ks], None).float() for ks in slices).to(dtype)
    torch.testing.assert_close(got, want, **tol(dtype))
