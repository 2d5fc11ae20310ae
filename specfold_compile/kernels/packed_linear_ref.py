"""Pure-torch oracle for the packed linear layer: y = x @ W^T + b on the first `count` rows."""
from __future__ import annotations

import torch


def packed_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      count: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] (leading dims are rows), weight [M, K], bias [M] or None -> y [..., M] in x.dtype,
    computed in float32. Rows >= count are unspecified in the kernel; the oracle computes all."""
    y = x.float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
