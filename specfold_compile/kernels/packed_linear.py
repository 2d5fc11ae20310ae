"""Triton packed linear: a tiled GEMM over the packed (computed) rows, y = x @ W^T + b.

The grid covers every row tile of rows ``[row_start, R)`` (shape-only), and a program whose row tile
starts at or beyond ``count`` (read on the device) exits at once: the work shrinks with the recompute
ratio without the host reading ``count``. ``row_start`` and ``out`` let a caller compute the first rows
another way (fold_ops hands them to cuBLAS) and spill only the rest here. fp32 accumulation; on CUDA
the tile sizes are autotuned (among row tiles of at least ``min_block_r`` rows).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import _common

from ._common import dot_precision, use_autotune
from .interpreter_bf16 import refuse_broken_bf16


# (BLOCK_R, BLOCK_N, BLOCK_K, num_warps, num_stages): the autotuner's candidates. Every row tile reads the
# whole weight, so small row tiles lose badly once many rows spill; the caller's ``min_block_r`` (the
# device profile's ``packed_linear_min_block_r``, 64 on the H200) keeps only the tiles of at least that
# many rows, and 16 brings back every candidate for A/B runs.
_TILES = [
    (16, 32, 128, 2, 4), (32, 32, 128, 4, 4), (16, 32, 256, 4, 3),
    (16, 64, 128, 4, 4), (16, 128, 128, 4, 4), (32, 64, 128, 4, 4), (32, 128, 64, 4, 4),
    (64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3),
    (128, 256, 64, 8, 3), (64, 256, 64, 8, 3),
]
LARGEST_BLOCK_R = max(t[0] for t in _TILES)


def check_min_block_r(value, name: str = "min_block_r") -> int:
    """A row-tile bound that leaves some config: an int in 1..LARGEST_BLOCK_R (``name`` in the error)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= LARGEST_BLOCK_R
    _common.expect(ok, name, f"an integer from 1 to {LARGEST_BLOCK_R}", repr(value))
    return value


def _cuda_configs(min_block_r: int):
    """The autotuner's tile configs, those with row tiles of at least ``min_block_r`` rows."""
    bound = check_min_block_r(min_block_r)
    return [triton.Config({"BLOCK_R": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
            for bm, bn, bk, w, s in _TILES if bm >= bound]


@triton.jit
def _packed_linear_body(
    x_ptr, w_ptr, b_ptr, y_ptr, count_ptr,
    R, M, K, R_KEY, ROW_START,
    stride_xr, stride_wm, stride_yr,
    HAS_BIAS: tl.constexpr, HAS_COUNT: tl.constexpr, PREC: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_n = tl.program_id(1)
    r0 = ROW_START + pid_r * BLOCK_R
    if HAS_COUNT:
        cnt = tl.load(count_ptr)
        if r0 >= cnt:
            return
    rr = r0 + tl.arange(0, BLOCK_R)
    nn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rr < R
    nmask = nn < M
    x_rows = x_ptr + rr.to(tl.int64)[:, None] * stride_xr
    w_rows = w_ptr + nn.to(tl.int64)[None, :] * stride_wm
    acc = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
    # Operands go from memory to tl.dot unconverted: a convert in between keeps Hopper's pipeliner from
    # feeding wgmma straight from shared memory (bf16 dots are exact under the test interpreter patch).
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            a = tl.load(x_rows + kk[None, :], mask=rmask[:, None], other=0.0)
            w = tl.load(w_rows + kk[:, None], mask=nmask[None, :], other=0.0)
        else:
            kmask = kk < K
            a = tl.load(x_rows + kk[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
            w = tl.load(w_rows + kk[:, None], mask=kmask[:, None] & nmask[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PREC)
    if HAS_BIAS:
        bias = tl.load(b_ptr + nn, mask=nmask, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    tl.store(y_ptr + rr.to(tl.int64)[:, None] * stride_yr + nn[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & nmask[None, :])


class _TuneWithWork:
    """Autotuner hooks: while configs are timed, ``count`` says a quarter of the covered rows are computed.

    The autotuner runs on the first call, whose device-side count may leave no tile of rows
    ``[ROW_START, R)`` to compute (the usual case for a spill behind the cuBLAS head): every config then
    "runs" in the same ~2 us and an arbitrary one is kept, to be used later when rows do spill. Timing
    with some work makes the choice mean something; the caller's count is restored afterwards.
    """

    def __init__(self) -> None:
        self.saved: torch.Tensor | None = None

    def pre(self, kwargs, reset_only: bool = False) -> None:
        if reset_only or not kwargs.get("HAS_COUNT"):
            return
        count, start, rows = kwargs["count_ptr"], kwargs["ROW_START"], kwargs["R"]
        self.saved = count.clone()
        count.fill_(start + max(1, (rows - start + 3) // 4))

    def post(self, kwargs, exception=None) -> None:
        if self.saved is not None:
            kwargs["count_ptr"].copy_(self.saved)
            self.saved = None


_packed_linear_kernel = _packed_linear_body


@functools.lru_cache(maxsize=None)
def _tuned_kernel(min_block_r: int):
    """The autotuned kernel over the configs with row tiles of at least ``min_block_r`` rows (one
    autotuner, with its own tuned configs, per bound)."""
    hooks = _TuneWithWork()
    return triton.autotune(
        configs=_cuda_configs(min_block_r), key=["R_KEY", "M", "K"], pre_hook=hooks.pre, post_hook=hooks.post,
    )(triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})(_packed_linear_body))


def _row_bucket(rows: int) -> int:
    """Autotuning key for the row count: the next power of two, so a new branch count N (rows = N*B)
    reuses the tuned config of its bucket instead of re-tuning every linear (seconds each)."""
    return max(16, triton.next_power_of_2(rows))


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  count: torch.Tensor | None, *, min_block_r: int, row_start: int = 0,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] (leading dims are rows; last dim contiguous), weight [M, K], bias [M] or None,
    count int64 0-d device tensor (None: all rows). Returns y [..., M] in x.dtype; rows >= count
    are unspecified. Only rows >= ``row_start`` are written (into ``out`` [R, M] when given).
    ``min_block_r``: the autotuner (CUDA) keeps row tiles of at least this many rows."""
    lead = x.shape[:-1]
    K = x.shape[-1]
    _common.expect(weight.dim() == 2 and weight.shape[1] == K, "weight", f"[M, {K}] (x's last dim)",
                   tuple(weight.shape))
    M = weight.shape[0]
    refuse_broken_bf16(x.dtype, "packed_linear")
    _common.expect(bias is None or tuple(bias.shape) == (M,), "bias", f"None or [{M}]",
                   None if bias is None else tuple(bias.shape))
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    R = x2.shape[0]
    y = _common.empty((R, M), x.dtype, x.device) if out is None else out
    _common.expect(0 <= row_start <= R, "row_start", f"0..{R}", row_start)
    _common.expect(y.shape == (R, M) and y.stride(-1) == 1, "out", f"[{R}, {M}] with a contiguous last dim",
                   f"{tuple(y.shape)} strides {tuple(y.stride())}")
    if R == row_start or M == 0:
        return y.view(*lead, M)
    common = dict(HAS_BIAS=bias is not None, HAS_COUNT=count is not None, PREC=dot_precision(x.dtype))
    args = (x2, weight, bias if bias is not None else y, y, count if count is not None else y,
            R, M, K, _row_bucket(R - row_start), row_start, x2.stride(0), weight.stride(0), y.stride(0))
    check_min_block_r(min_block_r)
    if use_autotune():
        grid = lambda meta: (triton.cdiv(R - row_start, meta["BLOCK_R"]), triton.cdiv(M, meta["BLOCK_N"]))
        _tuned_kernel(min_block_r)[grid](*args, **common)
    else:
        BR, BN, BK = 16, 32, 32
        grid = (triton.cdiv(R - row_start, BR), triton.cdiv(M, BN))
        _packed_linear_kernel[grid](*args, **common, BLOCK_R=BR, BLOCK_N=BN, BLOCK_K=BK, EVEN_K=K % BK == 0,
                                    num_warps=4)
    return y.view(*lead, M)
