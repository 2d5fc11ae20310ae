import os

import torch

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
