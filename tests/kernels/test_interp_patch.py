"""The test-only interpreter patch makes bf16 dots and fp32 -> bf16 casts exact."""
import os

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                                reason="interpreter-only patch")


@triton.jit
def _bf16_dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    c = tl.dot(a, b)                           # bf16 operands, fp32 accumulator
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], c.to(tl.bfloat16))


@triton.jit
def _cast_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, x.to(tl.bfloat16), mask=offs < n)


def test_bf16_dot_matches_torch():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, 32, generator=gen).bfloat16()
    b = torch.randn(32, 16, generator=gen).bfloat16()
    c = torch.empty(16, 16, dtype=torch.bfloat16)
    _bf16_dot_kernel[(1,)](a, b, c, M=16, N=16, K=32)
    expect = (a.float() @ b.float()).bfloat16()
    # equal up to one bf16 rounding step (summation order differs)
    torch.testing.assert_close(c.float(), expect.float(), rtol=8e-3, atol=1e-6)
    assert (c == expect).float().mean() > 0.9


def test_fp32_to_bf16_cast_rounds_to_nearest_even():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 7
    x[:4] = torch.tensor([1.00390625, 1.01171875, -3.3e-39, float("inf")])  # ties, subnormal, inf
    y = torch.empty(1000, dtype=torch.bfloat16)
    _cast_kernel[(1,)](x, y, 1000, BLOCK=1024)
    assert torch.equal(y.view(torch.int16), x.bfloat16().view(torch.int16))
