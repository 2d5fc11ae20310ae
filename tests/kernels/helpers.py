import os

import torch

from specfold_compile.kernels.gate_ref import resolve_folds_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def tol(dtype):
    if dtype == torch.float32:
        return dict(rtol=1e-5, atol=1e-5)
    return dict(rtol=1e-2, atol=1e-2)


def randn(*shape, dtype=torch.float32, gen=None, scale=1.0):
    """Random normal values, never all zero, in the given dtype on the test device."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float32) * scale
    return x.to(device=DEVICE, dtype=dtype)


def rel_err(a, b):
    a = a.float()
    b = b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def attention_tuning(**changes):
    """The H200 profile's attention launch choices, with ``changes`` (the launchers take them as an argument)."""
    import dataclasses

    from specfold_compile.ops.device_profile import H200

    return dataclasses.replace(H200.attention, **changes)


ATT = attention_tuning()


def strided_q(R, Hq, D, dtype, gen):
    """[R, Hq, D] view with a non-trivial row stride (as produced from a [R, 1, Hq, D] buffer
    with extra room), last dim contiguous."""
    buf = randn(R, 1, Hq + 1, D, dtype=dtype, gen=gen)
    return buf[:, 0, 1:, :]


def cache_view(Hkv, P, D, dtype, gen):
    """k_pre, v_pre [Hkv, P, D] as strided views of bigger caches, with different strides (the kernels
    must not read v_pre with k_pre's)."""
    cache = randn(2, 2, Hkv, P + 3, D, dtype=dtype, gen=gen)
    v_cache = randn(Hkv + 1, P + 7, D, dtype=dtype, gen=gen)
    return cache[0, 1, :, 2:P + 2], v_cache[1:, 4:P + 4]


def packed_problem(N, B, Hkv, G, D, P, dtype, p_fold, gen):
    Hq = Hkv * G
    fold = torch.rand(N, B, generator=gen) < p_fold
    parents = torch.tensor([-1] + [int(torch.randint(0, n, (1,), generator=gen)) for n in range(1, N)])
    _, _, count, slot = resolve_folds_ref(fold, parents)
    R = int(count) + 2  # packed buffer with some unused tail rows
    q = strided_q(R, Hq, D, dtype, gen)
    k = randn(R, Hkv, D, dtype=dtype, gen=gen)
    v = randn(R, Hkv, D, dtype=dtype, gen=gen)
    k_pre, v_pre = cache_view(Hkv, P, D, dtype, gen)
    return q, k, v, k_pre, v_pre, slot.to(DEVICE)
