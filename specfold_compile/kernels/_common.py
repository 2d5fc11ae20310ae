"""Small helpers shared by the Triton launchers (importable only with triton)."""
from __future__ import annotations

import os

import torch
import triton.language as tl


def empty(shape, dtype, device):
    """Output allocation used by every launcher (tests replace it to poison outputs)."""
    return torch.empty(shape, dtype=dtype, device=device)


def expect(ok: bool, name: str, expected: str, got) -> None:
    """The launchers' input check: a ValueError naming the argument, what it must be and what it was."""
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {got}")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_autotune() -> bool:
    return torch.cuda.is_available() and not interpreting()


def tl_dtype(dt: torch.dtype):
    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dt]


def dot_precision(dt: torch.dtype) -> str:
    # fp32 operands: exact IEEE products (the GPU would otherwise use tf32); ignored for 16-bit.
    return "ieee" if dt == torch.float32 else "tf32"
