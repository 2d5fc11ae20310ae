"""bf16 under Triton's CPU interpreter (``TRITON_INTERPRET=1``): refused where the interpreter gets it wrong.

Triton 3.6's interpreter stores bf16 as raw 16-bit integers: ``tl.dot`` on bf16 operands multiplies the
bit patterns as integers, and casts to bf16 truncate instead of rounding to nearest even, so the
kernels that multiply or store bf16 (attention, the packed linear, SwiGLU) return garbage there. Before
such a kernel runs on bf16 under the interpreter, one tiny probe kernel (run once per process) checks a
bf16 dot and a cast; if either is wrong, the launcher raises a one-line error instead of returning
garbage. A GPU is never probed; a fixed interpreter passes the probe. The fold gate only loads bf16 and
converts it to float32, which the interpreter does right: it is not refused.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._common import interpreting

_N = 16


@triton.jit
def _bf16_probe_kernel(a_ptr, b_ptr, dot_ptr, x_ptr, cast_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    tl.store(dot_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))
    tl.store(cast_ptr + r, tl.load(x_ptr + r).to(tl.bfloat16))


@functools.lru_cache(maxsize=1)
def interpreter_bf16_ok() -> bool:
    """Whether this interpreter computes a bf16 dot and an fp32 -> bf16 cast as a GPU would."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(_N, _N, generator=g).bfloat16()
    b = torch.randn(_N, _N, generator=g).bfloat16()
    x = torch.randn(_N, generator=g) * 3
    x[0] = 1.01171875  # halfway between two bf16 values: rounds to even, truncation does not
    dot = torch.empty(_N, _N, dtype=torch.float32)
    cast = torch.empty(_N, dtype=torch.bfloat16)
    _bf16_probe_kernel[(1,)](a, b, dot, x, cast, N=_N)
    dot_ok = torch.allclose(dot, a.float() @ b.float(), rtol=1e-4, atol=1e-4)
    return dot_ok and torch.equal(cast.view(torch.int16), x.bfloat16().view(torch.int16))


def refuse_broken_bf16(dtype: torch.dtype, what: str) -> None:
    """Raise when ``what`` would run a bf16 Triton kernel under an interpreter that computes bf16 wrongly."""
    if dtype == torch.bfloat16 and interpreting() and not interpreter_bf16_ok():
        raise RuntimeError(f"{what}: bf16 under Triton's CPU interpreter (TRITON_INTERPRET=1) gives wrong "
                           f"results (bf16 dots on the raw bits, truncating casts, triton {triton.__version__}); "
                           f"use float32, kernels='torch', or a GPU")
