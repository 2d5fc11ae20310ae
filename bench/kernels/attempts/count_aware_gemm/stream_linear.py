# Session 9 attempt, reverted (see README.md here).
"""Experimental count-aware GEMM: row groups of SUB x BLOCK_R rows share each weight tile in one program;
split-K into an fp32 workspace that the cast kernel re-zeroes."""
import torch
import triton
import triton.language as tl


@triton.jit
def _stream_kernel(x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, count_ptr,
                   R, M, K, ROW_START, stride_xr, stride_wm, stride_yr,
                   HAS_BIAS: tl.constexpr, HAS_COUNT: tl.constexpr, EVEN_K: tl.constexpr,
                   BLOCK_R: tl.constexpr, SUB: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPLIT_K: tl.constexpr, GROUPS_OUTER: tl.constexpr):
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(M, BLOCK_N)
    n_groups = tl.cdiv(R - ROW_START, BLOCK_R * SUB)
    split = pid % SPLIT_K
    t = pid // SPLIT_K
    if GROUPS_OUTER:
        g = t // n_tiles
        n = t % n_tiles
    else:
        g = t % n_groups
        n = t // n_groups
    r0 = ROW_START + g * (BLOCK_R * SUB)
    end = R
    if HAS_COUNT:
        end = tl.minimum(tl.load(count_ptr).to(tl.int32), R)
        if r0 >= end:
            return
    k_per = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = split * k_per
    k_hi = tl.minimum(K, k_lo + k_per)
    rr0 = r0 + tl.arange(0, BLOCK_R)
    rr1 = rr0 + BLOCK_R
    nn = n * BLOCK_N + tl.arange(0, BLOCK_N)
    m0 = rr0 < end
    m1 = rr1 < end
    nmask = nn < M
    x0 = x_ptr + rr0.to(tl.int64)[:, None] * stride_xr
    x1 = x_ptr + rr1.to(tl.int64)[:, None] * stride_xr
    wp = w_ptr + nn.to(tl.int64)[None, :] * stride_wm
    acc0 = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
    two = SUB > 1 and r0 + BLOCK_R < end
    if two:
        for k0 in range(k_lo, k_hi, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            if EVEN_K:
                w = tl.load(wp + kk[:, None], mask=nmask[None, :], other=0.0)
                a0 = tl.load(x0 + kk[None, :], mask=m0[:, None], other=0.0)
                a1 = tl.load(x1 + kk[None, :], mask=m1[:, None], other=0.0)
            else:
                km = kk < k_hi
                w = tl.load(wp + kk[:, None], mask=km[:, None] & nmask[None, :], other=0.0)
                a0 = tl.load(x0 + kk[None, :], mask=m0[:, None] & km[None, :], other=0.0)
                a1 = tl.load(x1 + kk[None, :], mask=m1[:, None] & km[None, :], other=0.0)
            acc0 = tl.dot(a0, w, acc0)
            acc1 = tl.dot(a1, w, acc1)
    else:
        for k0 in range(k_lo, k_hi, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            if EVEN_K:
                w = tl.load(wp + kk[:, None], mask=nmask[None, :], other=0.0)
                a0 = tl.load(x0 + kk[None, :], mask=m0[:, None], other=0.0)
            else:
                km = kk < k_hi
                w = tl.load(wp + kk[:, None], mask=km[:, None] & nmask[None, :], other=0.0)
                a0 = tl.load(x0 + kk[None, :], mask=m0[:, None] & km[None, :], other=0.0)
            acc0 = tl.dot(a0, w, acc0)
    if HAS_BIAS:
        if split == 0:
            bias = tl.load(b_ptr + nn, mask=nmask, other=0.0).to(tl.float32)
            acc0 += bias[None, :]
            acc1 += bias[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptr + rr0.to(tl.int64)[:, None] * stride_yr + nn[None, :], acc0.to(y_ptr.dtype.element_ty),
                 mask=m0[:, None] & nmask[None, :])
        if two:
            tl.store(y_ptr + rr1.to(tl.int64)[:, None] * stride_yr + nn[None, :], acc1.to(y_ptr.dtype.element_ty),
                     mask=m1[:, None] & nmask[None, :])
    else:
        tl.atomic_add(ws_ptr + rr0.to(tl.int64)[:, None] * M + nn[None, :], acc0, mask=m0[:, None] & nmask[None, :],
                      sem="relaxed")
        if two:
            tl.atomic_add(ws_ptr + rr1.to(tl.int64)[:, None] * M + nn[None, :], acc1,
                          mask=m1[:, None] & nmask[None, :], sem="relaxed")


@triton.jit
def _cast_kernel(ws_ptr, y_ptr, count_ptr, R, M, ROW_START, stride_yr, HAS_COUNT: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr):
    r0 = ROW_START + tl.program_id(0) * BLOCK_R
    end = R
    if HAS_COUNT:
        end = tl.minimum(tl.load(count_ptr).to(tl.int32), R)
        if r0 >= end:
            return
    rr = r0 + tl.arange(0, BLOCK_R)
    mm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = (rr < end)[:, None] & (mm < M)[None, :]
    p = ws_ptr + rr.to(tl.int64)[:, None] * M + mm[None, :]
    v = tl.load(p, mask=mask, other=0.0)
    tl.store(y_ptr + rr.to(tl.int64)[:, None] * stride_yr + mm[None, :], v.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(p, tl.zeros_like(v), mask=mask)


_WS = {}


def workspace(R, M, device):
    key = (R, M, str(device))
    if key not in _WS:
        _WS[key] = torch.zeros(R, M, dtype=torch.float32, device=device)
    return _WS[key]


def stream_linear(x, w, b, count, y, row_start=0, *, BLOCK_R=64, SUB=1, BLOCK_N=128, BLOCK_K=64, SPLIT_K=1,
                  GROUPS_OUTER=False, num_warps=4, num_stages=3):
    R, K = x.shape
    M = w.shape[0]
    ws = workspace(R, M, x.device) if SPLIT_K > 1 else y
    n_groups = triton.cdiv(R - row_start, BLOCK_R * SUB)
    grid = (SPLIT_K * triton.cdiv(M, BLOCK_N) * n_groups,)
    _stream_kernel[grid](x, w, b if b is not None else y, y, ws, count if count is not None else y,
                         R, M, K, row_start, x.stride(0), w.stride(0), y.stride(0),
                         HAS_BIAS=b is not None, HAS_COUNT=count is not None, EVEN_K=K % BLOCK_K == 0,
                         BLOCK_R=BLOCK_R, SUB=SUB, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, SPLIT_K=SPLIT_K,
                         GROUPS_OUTER=GROUPS_OUTER, num_warps=num_warps, num_stages=num_stages)
    if SPLIT_K > 1:
        CR, CM = 16, 256
        _cast_kernel[(triton.cdiv(R - row_start, CR), triton.cdiv(M, CM))](
            ws, y, count if count is not None else y, R, M, row_start, y.stride(0),
            HAS_COUNT=count is not None, BLOCK_R=CR, BLOCK_M=CM)
    return y


from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _tma_kernel(x_desc, w_desc, y_ptr, count_ptr, R, M, K, ROW_START, stride_yr,
                HAS_COUNT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                NUM_STAGES: tl.constexpr):
    pid = tl.program_id(0)
    n_groups = tl.cdiv(R - ROW_START, BLOCK_R)
    g = pid % n_groups
    n = pid // n_groups
    r0 = ROW_START + g * BLOCK_R
    end = R
    if HAS_COUNT:
        end = tl.minimum(tl.load(count_ptr).to(tl.int32), R)
        if r0 >= end:
            return
    acc = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        a = x_desc.load([r0, k0])
        w = w_desc.load([n * BLOCK_N, k0])
        acc = tl.dot(a, w.T, acc)
    rr = r0 + tl.arange(0, BLOCK_R)
    nn = n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(y_ptr + rr.to(tl.int64)[:, None] * stride_yr + nn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rr < end)[:, None] & (nn < M)[None, :])


def tma_linear(x, w, b, count, y, row_start=0, *, BLOCK_R=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4,
               **_):
    R, K = x.shape
    M = w.shape[0]
    x_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [BLOCK_R, BLOCK_K])
    w_desc = TensorDescriptor(w, list(w.shape), list(w.stride()), [BLOCK_N, BLOCK_K])
    grid = (triton.cdiv(M, BLOCK_N) * triton.cdiv(R - row_start, BLOCK_R),)
    _tma_kernel[grid](x_desc, w_desc, y, count if count is not None else y, R, M, K, row_start, y.stride(0),
                      HAS_COUNT=count is not None, BLOCK_R=BLOCK_R, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                      NUM_STAGES=num_stages, num_warps=num_warps)
    return y
