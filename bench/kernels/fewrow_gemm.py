"""A probe, not a backend kernel: a Triton GEMM for few rows, y = x @ W^T on the first ``count`` rows (count
read on the device), to measure whether a count-aware GEMM can beat the packed linears' cuBLAS head
(``bench_count_gemm.py``'s ``triton_fewrow`` variants; the result: docs/design-notes.md, "Packing with a
fixed dense head").

It is built the way small-row GEMMs are usually made fast: the weight's output features go on the MMA's
wide side and the rows on its narrow side ("swap AB"), the weight streams through shared memory by TMA
loads, and K is split when the output features alone give too few programs (an ordered fp32 reduce).
Rows go in tiles of ``tile`` (64, 128 or 256); a program reads ``count`` and runs its K loop at the
smallest row width (64, 128 or 256) that covers its tile's computed rows: a small tile compiles fewer
widths and keeps more programs on an SM, a large one reads the weight once for more rows. Needs TMA
(CUDA capability 9.0, or the interpreter) and rows of a multiple of 16 bytes. Rows >= count are
unspecified.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from specfold_compile.kernels._common import dot_precision, expect, interpreting

ROW_WIDTHS = (64, 128, 256)  # the K loop's row widths; a row tile is one of them (``tile``)


@triton.jit
def _rows_tile(w_desc, x_desc, b_ptr, y_ptr, part_ptr, R, M, r0, n0, k_lo, k_hi, pid_k,
               HAS_BIAS: tl.constexpr, PREC: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr,
               ROWS: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr):
    acc = tl.zeros([BLOCK_N, ROWS], dtype=tl.float32)
    # out-of-range K columns load as zeros on both sides (TMA), so a ragged last tile adds nothing
    for k in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):
        w = w_desc.load([n0, k])
        x = x_desc.load([r0, k])
        acc = tl.dot(w, tl.trans(x), acc, input_precision=PREC)
    out = tl.trans(acc)  # [ROWS, BLOCK_N]
    rr = r0 + tl.arange(0, ROWS)
    nn = n0 + tl.arange(0, BLOCK_N)
    mask = (rr < R)[:, None] & (nn < M)[None, :]
    offs = rr.to(tl.int64)[:, None] * M + nn[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            out = out + tl.load(b_ptr + nn, mask=nn < M, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + pid_k.to(tl.int64) * R * M + offs, out, mask=mask)


@triton.jit
def _fewrow_kernel(w_desc, x64_desc, x128_desc, x256_desc, b_ptr, y_ptr, part_ptr, count_ptr, R, M, K, K_PER,
                   HAS_BIAS: tl.constexpr, HAS_COUNT: tl.constexpr, PREC: tl.constexpr, SPLIT_K: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, TILE: tl.constexpr):
    n0 = tl.program_id(0) * BLOCK_N
    pid_k = tl.program_id(1)
    r0 = tl.program_id(2) * TILE
    rows = R
    if HAS_COUNT:
        rows = tl.minimum(tl.load(count_ptr).to(tl.int32), R)
    left = rows - r0
    k_lo = pid_k * K_PER
    k_hi = tl.minimum(k_lo + K_PER, K)
    # TILE is a compile-time constant: widths above it are not compiled (nor sized for in shared memory)
    if TILE >= 256 and left > 128:
        _rows_tile(w_desc, x256_desc, b_ptr, y_ptr, part_ptr, R, M, r0, n0, k_lo, k_hi, pid_k, HAS_BIAS, PREC,
                   SPLIT_K, BLOCK_N, 256, BLOCK_K, NUM_STAGES)
    elif TILE >= 128 and left > 64:
        _rows_tile(w_desc, x128_desc, b_ptr, y_ptr, part_ptr, R, M, r0, n0, k_lo, k_hi, pid_k, HAS_BIAS, PREC,
                   SPLIT_K, BLOCK_N, 128, BLOCK_K, NUM_STAGES)
    elif left > 0:
        _rows_tile(w_desc, x64_desc, b_ptr, y_ptr, part_ptr, R, M, r0, n0, k_lo, k_hi, pid_k, HAS_BIAS, PREC,
                   SPLIT_K, BLOCK_N, 64, BLOCK_K, NUM_STAGES)


@triton.jit
def _split_k_reduce_kernel(part_ptr, b_ptr, y_ptr, count_ptr, R, M,
                           HAS_BIAS: tl.constexpr, HAS_COUNT: tl.constexpr, SPLIT_K: tl.constexpr,
                           BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rows = R
    if HAS_COUNT:
        rows = tl.minimum(tl.load(count_ptr).to(tl.int32), R)
    if tl.program_id(0).to(tl.int64) * BLOCK < rows.to(tl.int64) * M:
        mask = offs < rows.to(tl.int64) * M
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for s in range(SPLIT_K):  # in split order: the sum does not depend on which program finished first
            acc += tl.load(part_ptr + s * R * M + offs, mask=mask, other=0.0)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs % M, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def fewrow_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``fewrow_gemm`` can take these operands here: TMA (CUDA capability >= 9.0, or the
    interpreter), fp32 / fp16 / bf16, and rows of a whole number of 16-byte units."""
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16) or weight.dtype != x.dtype:
        return False
    if (x.shape[-1] * x.element_size()) % 16:
        return False
    if interpreting():
        return True
    return x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9


def tile_config(M: int, K: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, SPLIT_K, NUM_STAGES) for a weight [M, K], the fastest of 16 configs at most
    counts in a sweep on an H100 (1.5B and 7B shapes, 64-256 computed rows) as a rule: 128 output features
    a program for the widest weights (gate_up), 4 K splits for the deepest (down), 64 K columns a stage
    (a 256-row stage of x is then 32 KB, and four stages of both operands fit in shared memory)."""
    return (128 if max(M, K) >= 16384 else 64), 64, (4 if K >= 8192 else 1), 4


def fewrow_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, count: torch.Tensor | None,
                *, config: tuple[int, int, int, int] | None = None, tile: int = 256) -> torch.Tensor:
    """x [..., K] (leading dims are rows), weight [M, K], bias [M] or None, count an int64 0-d device
    tensor (None: all rows) -> y [..., M] in x.dtype; rows >= count are unspecified. ``config``:
    (BLOCK_N, BLOCK_K, SPLIT_K, NUM_STAGES), default ``tile_config``; ``tile``: rows a program (64, 128, 256)."""
    expect(tile in ROW_WIDTHS, "tile", f"one of {ROW_WIDTHS}", tile)
    K = x.shape[-1]
    expect(weight.dim() == 2 and weight.shape[1] == K, "weight", f"[M, {K}] (x's last dim)", tuple(weight.shape))
    expect(fewrow_supported(x, weight), "x", "fp32/fp16/bf16 operands of one dtype, rows of a multiple of 16 "
           "bytes, on a device with TMA", f"{x.dtype}/{weight.dtype}, K = {K}, {x.device}")
    M = weight.shape[0]
    expect(bias is None or tuple(bias.shape) == (M,), "bias", f"None or [{M}]",
           None if bias is None else tuple(bias.shape))
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K).contiguous()
    weight = weight.contiguous()
    R = x2.shape[0]
    y = torch.empty((R, M), dtype=x.dtype, device=x.device)
    if R == 0 or M == 0:
        return y.view(*lead, M)
    block_n, block_k, split, stages = config or tile_config(M, K)
    k_per = triton.cdiv(triton.cdiv(K, split), block_k) * block_k
    split = triton.cdiv(K, k_per)
    part = torch.empty((split, R, M), dtype=torch.float32, device=x.device) if split > 1 else y
    w_desc = TensorDescriptor.from_tensor(weight, [block_n, block_k])
    x_descs = [TensorDescriptor.from_tensor(x2, [rows, block_k]) for rows in ROW_WIDTHS]
    flags = dict(HAS_BIAS=bias is not None, HAS_COUNT=count is not None)
    b = bias if bias is not None else y
    c = count if count is not None else y
    grid = (triton.cdiv(M, block_n), split, triton.cdiv(R, tile))
    # one warpgroup (4 warps) a 64-feature slice of the MMA's wide side
    _fewrow_kernel[grid](w_desc, *x_descs, b, y, part, c, R, M, K, k_per, **flags, PREC=dot_precision(x.dtype),
                         SPLIT_K=split, BLOCK_N=block_n, BLOCK_K=block_k, NUM_STAGES=stages, TILE=tile,
                         num_warps=4 * max(1, block_n // 64))
    if split > 1:
        block = 2048
        _split_k_reduce_kernel[(triton.cdiv(R * M, block),)](part, b, y, c, R, M, **flags, SPLIT_K=split,
                                                             BLOCK=block, num_warps=4)
    return y.view(*lead, M)
