"""Triton packed SwiGLU activation: out = silu(gate) * up on the computed rows of a packed MLP.

The packed MLP's tensors have one row per possibly-computed row (R = N * B, a shape-only bound), but
only the first ``count`` rows (read on the device) are computed; a plain elementwise kernel (what
Inductor generates) walks all R rows of the [R, intermediate] gate and up projections, the widest
tensors of the layer. Here a program whose row tile starts at or beyond ``count`` exits at once, so
the traffic shrinks with the recompute ratio, with no host read of ``count``. fp32 arithmetic, one
rounding to the output dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _common
from .interpreter_bf16 import refuse_broken_bf16


@triton.jit
def _silu_mul_kernel(
    gate_ptr, up_ptr, out_ptr, count_ptr,
    R, F,
    stride_gr, stride_ur, stride_or,
    HAS_COUNT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr,
):
    r0 = tl.program_id(0) * BLOCK_R
    if HAS_COUNT:
        cnt = tl.load(count_ptr)
        if r0 >= cnt:
            return
    rr = (r0 + tl.arange(0, BLOCK_R)).to(tl.int64)
    ff = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = (rr < R)[:, None] & (ff < F)[None, :]
    g = tl.load(gate_ptr + rr[:, None] * stride_gr + ff[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + rr[:, None] * stride_ur + ff[None, :], mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + rr[:, None] * stride_or + ff[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """[..., F] -> [R, F] without a copy where the rows are evenly strided (a split of a fused
    gate_up output is); the last dim must be contiguous."""
    t2 = t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t
    _common.expect(t2.stride(-1) == 1, name, "a contiguous last dim", f"strides {tuple(t.stride())}")
    return t2


# (BLOCK_R, BLOCK_F, num_warps) on the GPU: the best of 32 configs over 1.5B / 7B at N = 17 and ratios
# 0.19 / 1 (H200, ``bench_swiglu.py --sweep``): 2.9 / 5.3 / 4.5 / 15.6 us against 4.7 / 6.7 /
# 5.9 / 18.5 for (8, 512, 4). The interpreter runs smaller tiles (tiny test shapes).
SILU_MUL_CONFIG = (8, 256, 8)
_INTERPRETER_CONFIG = (4, 32, 4)


def _check_config(config) -> tuple[int, int, int]:
    ok = (isinstance(config, tuple) and len(config) == 3 and all(isinstance(v, int) and v > 0 for v in config)
          and all(v & (v - 1) == 0 for v in config))
    _common.expect(ok, "config", "(BLOCK_R, BLOCK_F, num_warps), powers of two", config)
    return config


def silu_mul(gate: torch.Tensor, up: torch.Tensor, count: torch.Tensor | None = None,
             config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """gate, up [..., F] of one shape and dtype (rows evenly strided, last dim contiguous: views such
    as the halves of a fused gate_up output are read in place); count: int64 0-d device tensor (None:
    every row); config: (BLOCK_R, BLOCK_F, num_warps), None for the default (SILU_MUL_CONFIG).
    Returns silu(gate) * up [..., F] in gate.dtype; rows >= count are unspecified."""
    _common.expect(gate.shape == up.shape and gate.dtype == up.dtype, "gate, up", "one shape and dtype",
                   f"{tuple(gate.shape)} {gate.dtype} and {tuple(up.shape)} {up.dtype}")
    refuse_broken_bf16(gate.dtype, "silu_mul")
    if config is None:  # the defaults need no check on this per-layer path
        config = _INTERPRETER_CONFIG if _common.interpreting() else SILU_MUL_CONFIG
    else:
        _check_config(config)
    BLOCK_R, BLOCK_F, num_warps = config
    g2, u2 = _rows(gate, "gate"), _rows(up, "up")
    R, F = g2.shape
    out = _common.empty((R, F), gate.dtype, gate.device)
    if R and F:
        grid = (triton.cdiv(R, BLOCK_R), triton.cdiv(F, BLOCK_F))
        _silu_mul_kernel[grid](g2, u2, out, count if count is not None else out, R, F,
                               g2.stride(0), u2.stride(0), out.stride(0),
                               HAS_COUNT=count is not None, BLOCK_R=BLOCK_R, BLOCK_F=BLOCK_F, num_warps=num_warps)
    return out.view(gate.shape)
