"""bench/kernels/fewrow_gemm.py, the few-row GEMM probe of bench_count_gemm: its timings mean something only if
it computes the GEMM. Against the packed linear's reference, under the interpreter here."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

pytest.importorskip("triton")

from bench.kernels.fewrow_gemm import ROW_WIDTHS, fewrow_gemm, fewrow_supported, tile_config  # noqa: E402
from specfold_compile.kernels import packed_linear_ref  # noqa: E402
from specfold_compile.testing import DEVICE, DTYPES, randn, tol  # noqa: E402

if DEVICE == "cuda" and torch.cuda.get_device_capability()[0] < 9:
    pytest.skip("TMA needs CUDA capability 9.0", allow_module_level=True)


@settings(deadline=None, max_examples=25)
@given(R=st.integers(1, 300), K=st.sampled_from([8, 16, 40, 64, 72]), M=st.integers(1, 70), bias=st.booleans(),
       count_mode=st.sampled_from(["none", "zero", "all", "mid", "past"]), tile=st.sampled_from(ROW_WIDTHS),
       config=st.sampled_from([None, (64, 16, 1, 2), (64, 16, 2, 3), (64, 32, 3, 2), (128, 16, 4, 2)]),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_fewrow_gemm_matches_reference(R, K, M, bias, count_mode, tile, config, dtype, seed):
    """Any row count (row tiles and their 64/128/256-row widths), ragged K tiles and split K, bias or none:
    the first ``count`` rows equal the reference's."""
    gen = torch.Generator().manual_seed(seed)
    x = randn(R, K, dtype=dtype, gen=gen)
    w = randn(M, K, dtype=dtype, gen=gen, scale=K ** -0.5)
    b = randn(M, dtype=dtype, gen=gen) if bias else None
    mid = int(torch.randint(1, R + 1, (1,), generator=gen))
    c = {"none": R, "zero": 0, "all": R, "mid": mid, "past": R + 7}[count_mode]
    count = None if count_mode == "none" else torch.tensor(c, dtype=torch.int64, device=DEVICE)
    y = fewrow_gemm(x, w, b, count, config=config, tile=tile)
    assert y.dtype == dtype and y.shape == (R, M)
    n = min(c, R)
    torch.testing.assert_close(y[:n].float(), packed_linear_ref(x, w, b)[:n].float(), **tol(dtype))


def test_fewrow_gemm_leading_dims_and_a_second_row_tile():
    gen = torch.Generator().manual_seed(3)
    x = randn(522, 1, 32, gen=gen)
    w = randn(24, 32, gen=gen)
    y = fewrow_gemm(x, w, None, torch.tensor(259, device=DEVICE), config=(64, 16, 2, 2))
    assert y.shape == (522, 1, 24)
    torch.testing.assert_close(y[:259], packed_linear_ref(x, w, None)[:259], **tol(torch.float32))


def test_tile_config_follows_the_weight():
    assert tile_config(37888, 3584)[:3] == (128, 64, 1)  # gate_up: wide
    assert tile_config(1536, 8960)[:3] == (64, 64, 4)  # down: deep


def test_fewrow_gemm_errors_name_the_argument():
    x = torch.randn(4, 6, device=DEVICE)  # 24-byte rows: TMA needs multiples of 16
    w = torch.randn(5, 6, device=DEVICE)
    assert not fewrow_supported(x, w)
    with pytest.raises(ValueError, match="^x: expected"):
        fewrow_gemm(x, w, None, None)
    with pytest.raises(ValueError, match="^tile: expected"):
        fewrow_gemm(torch.randn(4, 8, device=DEVICE), torch.randn(5, 8, device=DEVICE), None, None, tile=32)
