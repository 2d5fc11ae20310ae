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


def fold_test(h: torch.Tensor, parent: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """SPEC section 2's fold test of every row of ``h`` [N, B, C] against its row ``parent`` [N] (an index
    in [0, N) a row: ``safe_parents``, so row 0 and the rows of no valid parent test against themselves
    and are not cleared here): ``||h[n, b] - h[p, b]|| < tau * ||h[p, b]||`` in float32, bool [N, B]."""
    hf = h.float()
    hp = hf[parent]
    diff = torch.linalg.vector_norm(hf - hp, dim=-1)
    ref = torch.linalg.vector_norm(hp, dim=-1)
    return diff < tau.float() * ref                                 # NaN, tau = 0, zero parent -> False


class FoldChains:
    """The fold chains of rows with ``parents`` [N] (on the device the gates run on), ``block`` positions a
    row, made once a forward and shared by all its gates (the parents do not change between them): the
    rows that may fold, each position's link to the same position of its parent row, and the rounds of
    pointer jumping that reach the end of the longest chain. ``depth``: the longest run of valid parent
    links when the caller knows it (``chain_depth`` of parents on the host); None takes the bound N - 1.

    The gates by tensor ops, a few launches each whatever the rows: ``flags`` is ``fold_flags_ref``,
    ``resolve`` is ``resolve_folds_ref`` without a host read, and ``pack`` is what a folded forward needs
    of it, with one host read (the packed batch's size). Origins by pointer jumping: a folded position
    links to its parent row's position, a computed one to itself (a fixed point); after ``j`` rounds of
    ``link = link[link]`` a link is ``2^j`` steps up its chain."""

    def __init__(self, parents: torch.Tensor, block: int, depth: int | None = None):
        n_rows = parents.shape[0]
        self.valid = valid_parent_rows(parents)                     # [N]
        self.parent = safe_parents(parents)                         # [N], always a valid index
        self.flat = torch.arange(n_rows * block, device=parents.device, dtype=torch.int64).view(n_rows, block)
        self.parent_link = self.parent[:, None] * block + self.flat[0]  # [N, B]
        longest = n_rows - 1 if depth is None else depth
        self.rounds = max(longest - 1, 0).bit_length()              # ceil(log2(longest)): 2^rounds >= longest

    def flags(self, h: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        """``fold_flags_ref(h, parents, tau)``."""
        return fold_test(h, self.parent, tau) & self.valid[:, None]

    def _origins(self, fold: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fold = fold & self.valid[:, None]
        link = torch.where(fold, self.parent_link, self.flat).reshape(-1)
        for _ in range(self.rounds):
            link = link[link]
        return fold.reshape(-1), link

    def resolve(self, fold: torch.Tensor):
        """``resolve_folds_ref(fold, parents)``'s four outputs, no host read: the computed rows first in flat
        order by a stable sort of the folded flags, the tail zeroed."""
        folded, link = self._origins(fold)
        computed = ~folded
        count = computed.sum()
        order = torch.sort(folded.to(torch.uint8), stable=True).indices
        rows = torch.where(torch.arange(folded.numel(), device=fold.device) < count, order, 0)
        pos = torch.cumsum(computed.long(), 0) - 1
        return link.view(fold.shape), rows, count, pos[link].view(fold.shape)

    def pack(self, fold: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The packing of a folded forward: the computed rows (flat, in order; their count is the one host
        read) and each position's origin slot among them, [N, B]."""
        folded, link = self._origins(fold)
        computed = ~folded
        rows = computed.nonzero().squeeze(1)
        return rows, (torch.cumsum(computed.long(), 0) - 1)[link].view(fold.shape)


def chain_depth(parents: list[int]) -> int:
    """The longest run of valid parent links (``parents[n]`` in ``[0, n)``) of rows whose parents are on
    the host: how far a fold chain can reach."""
    depth = [0] * len(parents)
    for n, p in enumerate(parents):
        if 0 <= p < n:
            depth[n] = depth[p] + 1
    return max(depth, default=0)


def resolve_folds_jump(fold: torch.Tensor, parents: torch.Tensor):
    """``resolve_folds_ref``'s four outputs by tensor ops alone (``FoldChains.resolve``): no loop over rows
    and no host read, so a large batch of rows resolves in a few launches."""
    return FoldChains(parents.to(fold.device), fold.shape[1]).resolve(fold)


def fold_gate_ref(h: torch.Tensor, parents: torch.Tensor, tau: torch.Tensor, invalid_flag: torch.Tensor | None = None):
    """(fold_mask, origin, rows, count, slot); see specfold_compile.kernels.gate.fold_gate."""
    fold = fold_flags_ref(h, parents, tau)
    origin, rows, count, slot = resolve_folds_ref(fold, parents, invalid_flag)
    return fold, origin, rows, count, slot


def fold_gate_from_flags_ref(fold: torch.Tensor, parents: torch.Tensor, invalid_flag: torch.Tensor | None = None,
                             fold_rows: torch.Tensor | None = None, capacity: int | None = None,
                             overflow_flag: torch.Tensor | None = None):
    """(fold_mask, origin, rows, count, slot) of ``kernels.gate.fold_gate_from_flags``: the flags with
    ``fold_rows`` folded whole, rows 0 and those of an invalid parent cleared, resolved; with ``capacity``,
    the slots clamped to ``capacity - 1`` and ``overflow_flag`` set when more positions are computed."""
    if fold_rows is not None:
        fold = fold | fold_rows[:, None]
    fold = fold & valid_parent_rows(parents.to(fold.device))[:, None]
    origin, rows, count, slot = resolve_folds_ref(fold, parents, invalid_flag)
    if capacity is not None:
        overflow_flag.masked_fill_(count > capacity, True)
        slot = slot.clamp(max=capacity - 1)
    return fold, origin, rows, count, slot
