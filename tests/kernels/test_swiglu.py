"""The packed SwiGLU activation (kernels/swiglu.py) against its reference, on random inputs."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

pytest.importorskip("triton")

from specfold_compile.kernels import silu_mul, silu_mul_ref  # noqa: E402
from specfold_compile.testing import DEVICE, DTYPES, randn, tol  # noqa: E402


@settings(deadline=None, max_examples=30)
@given(R=st.integers(1, 40), F=st.integers(1, 90), fused=st.booleans(), three_d=st.booleans(),
       count_mode=st.sampled_from(["none", "zero", "all", "mid"]),
       dtype=st.sampled_from(DTYPES), scale=st.sampled_from([1.0, 8.0]), seed=st.integers(0, 2**31 - 1))
def test_silu_mul(R, F, fused, three_d, count_mode, dtype, scale, seed):
    """Both operands as separate tensors or as the two halves of one fused gate_up output (row stride
    2F, read in place); every row below count equals the reference."""
    gen = torch.Generator().manual_seed(seed)
    if fused:
        gate_up = randn(R, 2 * F, dtype=dtype, gen=gen, scale=scale)
        gate, up = gate_up.split(F, dim=-1)
    else:
        gate, up = randn(R, F, dtype=dtype, gen=gen, scale=scale), randn(R, F, dtype=dtype, gen=gen)
    if three_d:
        gate, up = gate.unsqueeze(1), up.unsqueeze(1)  # the packed layout [R, 1, F]
    c = {"none": R, "zero": 0, "all": R, "mid": int(torch.randint(1, R + 1, (1,), generator=gen))}[count_mode]
    count = None if count_mode == "none" else torch.tensor(c, dtype=torch.int64, device=DEVICE)
    y = silu_mul(gate, up, count)
    ref = silu_mul_ref(gate, up)
    assert y.dtype == dtype and y.shape == gate.shape
    torch.testing.assert_close(y.reshape(R, F)[:c].float(), ref.reshape(R, F)[:c].float(), **tol(dtype))


def test_silu_mul_skips_row_tiles_beyond_count():
    gen = torch.Generator().manual_seed(2)
    gate, up = randn(24, 40, gen=gen), randn(24, 40, gen=gen)
    y = silu_mul(gate, up, torch.tensor(5, device=DEVICE))
    torch.testing.assert_close(y[:5], silu_mul_ref(gate, up)[:5], **tol(torch.float32))
    if DEVICE == "cpu":  # row tiles of 4 under the interpreter: tiles from row 8 on never ran (NaN poison)
        assert torch.isnan(y[8:]).all()


def test_silu_mul_rejects_mismatched_operands():
    gen = torch.Generator().manual_seed(3)
    with pytest.raises(ValueError, match="gate, up"):
        silu_mul(randn(4, 8, gen=gen), randn(4, 9, gen=gen))
    with pytest.raises(ValueError, match="gate: expected a contiguous last dim"):
        g = randn(8, 4, gen=gen).t()
        silu_mul(g, g.contiguous())


@settings(deadline=None, max_examples=15)
@given(R=st.integers(1, 40), F=st.integers(1, 90), block_r=st.sampled_from([1, 2, 4, 8, 16]),
       block_f=st.sampled_from([16, 32, 64, 128, 256]), warps=st.sampled_from([4, 8]),
       count_mode=st.sampled_from(["zero", "mid", "all"]), seed=st.integers(0, 2**31 - 1))
def test_silu_mul_at_other_tile_configs(R, F, block_r, block_f, warps, count_mode, seed):
    """Any (BLOCK_R, BLOCK_F) tiles compute the same rows (the configs the benchmark's sweep times; the
    GPU default SILU_MUL_CONFIG = (8, 256, 8) among them)."""
    gen = torch.Generator().manual_seed(seed)
    gate, up = randn(R, 2 * F, gen=gen).split(F, dim=-1)
    c = {"zero": 0, "all": R, "mid": int(torch.randint(1, R + 1, (1,), generator=gen))}[count_mode]
    y = silu_mul(gate, up, torch.tensor(c, dtype=torch.int64, device=DEVICE), config=(block_r, block_f, warps))
    torch.testing.assert_close(y[:c], silu_mul_ref(gate, up)[:c], **tol(torch.float32))


def test_silu_mul_rejects_bad_configs():
    gen = torch.Generator().manual_seed(0)
    gate, up = randn(4, 8, gen=gen), randn(4, 8, gen=gen)
    for bad in [(8, 512), (8, 500, 4), (0, 512, 4), [8, 512, 4], (8.0, 512, 4)]:
        with pytest.raises(ValueError, match="config"):
            silu_mul(gate, up, config=bad)
