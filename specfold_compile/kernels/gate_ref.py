"""Pure-torch oracle for the residual fold gate (SPEC section 2, steps 1-2).

Readable, loop-based where it helps clarity; used by the tests and benchmarks as ground truth.

Invalid parents (``parents[n]`` outside ``[0, n)`` for a row ``n >= 1``, which eager ``model(...)``
rejects but a compiled call cannot check without reading them back to the host): such a row folds
nothing, so every one of its positions is computed, exactly as in the dense forward; no row is ever
read through an invalid parent. ``invalid_flag`` (an integer tensor of one element) is set to 1 when
any parent is invalid, ``parents[0] != -1`` included; it is never cleared here.
"""
from __future__ import annotations

import torch


def valid_parent_rows(parents: torch.Tensor) -> torch.Tensor:
    """bool [N]: row n >= 1 has a parent in [0, n) (row 0, the main branch, has none: False)."""
    n = torch.arange(parents.shape[0], device=parents.device)
    return (n >= 1) & (parents >= 0) & (parents < n)


def parents_invalid(parents: torch.Tensor) -> torch.Tensor:
    """0-d bool: some row's parent is invalid (``parents[0] != -1``, or a row n >= 1 outside [0, n))."""
    n = torch.arange(parents.shape[0], device=parents.device)
    bad = torch.where(n >= 1, ~valid_parent_rows(parents), parents != -1)
    return bad.any()


def safe_parents(parents: torch.Tensor) -> torch.Tensor:
    """parents with every invalid entry (row 0's too) replaced by the row itself: always a valid index."""
    n = torch.arange(parents.shape[0], device=parents.device, dtype=torch.int64)
    return torch.where(valid_parent_rows(parents), parents.long(), n)


def note_invalid_parents(parents: torch.Tensor, invalid_flag: torch.Tensor | None) -> None:
    if invalid_flag is not None:
        invalid_flag.masked_fill_(parents_invalid(parents).to(invalid_flag.device), 1)


def fold_flags_ref(h: torch.Tensor, parents: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """fold[n, b] = n >= 1 and ||h[n,b] - h[p,b]|| < tau * ||h[p,b]|| (float32, strict); False where the
    parent is invalid."""
    N, B, _ = h.shape
    hf = h.float()
    fold = torch.zeros(N, B, dtype=torch.bool, device=h.device)
    if N <= 1:
        return fold
    p = safe_parents(parents)[1:]
    hp = hf[p]                                   # [N-1, B, C]
    diff = torch.linalg.vector_norm(hf[1:] - hp, dim=-1)
    ref = torch.linalg.vector_norm(hp, dim=-1)
    fold[1:] = diff < tau.float() * ref          # NaN -> False, tau = 0 -> False, zero parent -> False
    return fold & valid_parent_rows(parents)[:, None]


def resolve_folds_ref(fold: torch.Tensor, parents: torch.Tensor, invalid_flag: torch.Tensor | None = None):
    """Origin map and compaction for a given fold mask (rows 0 and those with an invalid parent never fold).

    Returns (origin [N,B] int64, rows [N*B] int64, count 0-d int64, slot [N,B] int64).
    """
    N, B = fold.shape
    dev = fold.device
    flat = torch.arange(N * B, device=dev, dtype=torch.int64).view(N, B)
    fold = fold & valid_parent_rows(parents.to(dev))[:, None]
    note_invalid_parents(parents, invalid_flag)
    origin = flat.clone()
    for n in range(1, N):
        if fold[n].any():  # (the parent is valid)
            origin[n] = torch.where(fold[n], origin[int(parents[n])], flat[n])
    computed = ~fold.reshape(-1)
    count = computed.sum()
    idx = torch.nonzero(computed).flatten()
    rows = torch.zeros(N * B, dtype=torch.int64, device=dev)
    rows[: idx.numel()] = idx
    pos = torch.cumsum(computed.long(), 0) - 1      # position of each computed row in `rows`
    slot = pos[origin.reshape(-1)].view(N, B)
    return origin, rows, count.to(torch.int64), slot


def resolve_folds_jump(fold: torch.Tensor, parents: torch.Tensor):
    """``resolve_folds_ref``'s four outputs by tensor ops alone: no loop over rows and no host read, so a
    large batch of rows resolves in a few launches. Origins by pointer jumping: each position links to
    the same position of its parent row where it folds (else to itself, a fixed point); after ``j``
    rounds of ``link = link[link]`` a link is ``2^j`` steps up its fold chain, so ``ceil(log2(N - 1))``
    rounds reach every chain's computed end. The computed rows come first in flat order by a stable
    sort of the folded flags, the tail zeroed as in ``resolve_folds_ref``."""
    N, B = fold.shape
    dev = fold.device
    parents = parents.to(dev)
    flat = torch.arange(N * B, device=dev, dtype=torch.int64).view(N, B)
    fold = fold & valid_parent_rows(parents)[:, None]
    link = torch.where(fold, safe_parents(parents)[:, None] * B + flat[0], flat).reshape(-1)
    for _ in range(max(N - 2, 0).bit_length()):  # ceil(log2(N - 1)): the longest chain has N - 1 links
        link = link[link]
    computed = ~fold.reshape(-1)
    count = computed.sum()
    order = torch.sort(fold.reshape(-1).to(torch.uint8), stable=True).indices  # computed rows first, in order
    rows = torch.where(torch.arange(N * B, device=dev) < count, order, 0)
    pos = torch.cumsum(computed.long(), 0) - 1
    return link.view(N, B), rows, count, pos[link].view(N, B)


def fold_gate_ref(h: torch.Tensor, parents: torch.Tensor, tau: torch.Tensor, invalid_flag: torch.Tensor | None = None):
    """(fold_mask, origin, rows, count, slot); see specfold_compile.kernels.gate.fold_gate."""
    fold = fold_flags_ref(h, parents, tau)
    origin, rows, count, slot = resolve_folds_ref(fold, parents, invalid_flag)
    return fold, origin, rows, count, slot
