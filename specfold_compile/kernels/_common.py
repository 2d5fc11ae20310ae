"""Small helpers shared by the Triton launchers (importable only with triton)."""
from __future__ import annotations

import os

import torch
import triton.language as tl


def empty(shape, dtype, device):
    """Output allocation used by every launcher (tests replace it to poison outputs)."""
    return torch.empty(shape, dtype=dtype, device=device)


_ARRIVAL_COUNTERS: dict = {}


def arrival_counter(device: torch.device) -> torch.Tensor:
    """An int32 on ``device`` for the "last program to arrive finishes the job" pattern.

    A kernel's programs each ``atomic_add`` it once; the one that reads ``num_programs - 1`` does the
    final step and resets it to 0, so one zeroed buffer serves every launch with no memset launch.
    Launches that use it must not run concurrently (they run in stream order in a forward).
    """
    device = torch.device(device)
    counter = _ARRIVAL_COUNTERS.get(device)
    if counter is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the Triton fold gate needs one call outside CUDA-graph capture first "
                               "(it allocates a zeroed arrival counter); warm up before capturing")
        counter = _ARRIVAL_COUNTERS[device] = torch.zeros((), dtype=torch.int32, device=device)
    return counter


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_autotune() -> bool:
    return torch.cuda.is_available() and not interpreting()


def tl_dtype(dt: torch.dtype):
    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dt]


def dot_precision(dt: torch.dtype) -> str:
    # fp32 operands: exact IEEE products (the GPU would otherwise use tf32); ignored for 16-bit.
    return "ieee" if dt == torch.float32 else "tf32"
