"""Pure-torch oracle for the residual fold gate (SPEC section 2, steps 1-2).

Readable, loop-based where it helps clarity; used by the tests and benchmarks as ground truth.
"""
from __future__ import annotations

import torch


def fold_flags_ref(h: torch.Tensor, parents: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """fold[n, b] = n >= 1 and ||h[n,b] - h[p,b]|| < tau * ||h[p,b]|| (float32, strict)."""
    N, B, _ = h.shape
    hf = h.float()
    fold = torch.zeros(N, B, dtype=torch.bool, device=h.device)
    if N <= 1:
        return fold
    p = parents[1:].long()
    hp = hf[p]                                   # [N-1, B, C]
    diff = torch.linalg.vector_norm(hf[1:] - hp, dim=-1)
    ref = torch.linalg.vector_norm(hp, dim=-1)
    fold[1:] = diff < tau.float() * ref          # NaN -> False, tau = 0 -> False, zero parent -> False
    return fold


def resolve_folds_ref(fold: torch.Tensor, parents: torch.Tensor):
    """Origin map and compaction for a given fold mask.

    Returns (origin [N,B] int64, rows [N*B] int64, count 0-d int64, slot [N,B] int64).
    """
    N, B = fold.shape
    dev = fold.device
    flat = torch.arange(N * B, device=dev, dtype=torch.int64).view(N, B)
    fold = fold.clone()
    fold[0] = False
    origin = flat.clone()
    for n in range(1, N):
        p = int(parents[n])
        origin[n] = torch.where(fold[n], origin[p], flat[n])
    computed = ~fold.reshape(-1)
    count = computed.sum()
    idx = torch.nonzero(computed).flatten()
    rows = torch.zeros(N * B, dtype=torch.int64, device=dev)
    rows[: idx.numel()] = idx
    pos = torch.cumsum(computed.long(), 0) - 1      # position of each computed row in `rows`
    slot = pos[origin.reshape(-1)].view(N, B)
    return origin, rows, count.to(torch.int64), slot


def fold_gate_ref(h: torch.Tensor, parents: torch.Tensor, tau: torch.Tensor):
    """(fold_mask, origin, rows, count, slot); see specfold_compile.kernels.gate.fold_gate."""
    fold = fold_flags_ref(h, parents, tau)
    origin, rows, count, slot = resolve_folds_ref(fold, parents)
    return fold, origin, rows, count, slot
