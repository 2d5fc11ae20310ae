"""Pure-torch oracle for the packed SwiGLU activation: silu(gate) * up on the first `count` rows."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_mul_ref(gate: torch.Tensor, up: torch.Tensor, count: torch.Tensor | None = None) -> torch.Tensor:
    """gate, up [..., F] (leading dims are rows) -> silu(gate) * up [..., F] in gate.dtype, computed in
    float32 and rounded once (as Inductor's fused kernel does). Rows >= count are unspecified in the
    kernel; the oracle computes all."""
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)
