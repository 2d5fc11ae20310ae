"""Triton fold gate: fold flags, origin resolution and compaction, without host synchronisation.

Two launches, grids depend on shapes only (an invalid parent, see ``gate_ref``, folds nothing and is
never read through; the resolve kernel sets the caller's ``invalid_flag`` when there is one):
  1. ``_fold_flag_kernel``: one program per BLOCK_ROWS rows (n, b); fp32 sums of squares of the
     row-minus-parent difference and of the parent row, chunked over C (``flag_config``: a row whole up
     to 4096 channels).
  2. ``_resolve_kernel``: a single program; holds the [N, B] fold tile in registers, computes the
     compaction positions with ``tl.cumsum`` (deterministic), then resolves origins by pointer
     jumping (ceil(log2(N - 1)) rounds instead of a walk over N rows) and slots by one more gather: in
     registers (``tl.gather``) up to ``REGISTER_TILE_MAX`` tile elements, through global memory beyond.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _common

# Largest padded [N, B] tile whose pointer jumping runs in registers (tl.gather): checked on an H100 up to
# 512 x 32 and 256 x 64 (N = 257 at B = 32, N = 129 at B = 64); larger tiles take the global-memory rounds.
REGISTER_TILE_MAX = 16384


@triton.jit
def _fold_flag_kernel(
    h_ptr, parents_ptr, tau_ptr, fold_ptr,
    NB, B, C,
    stride_hn, stride_hb,
    BLOCK_ROWS: tl.constexpr, BLOCK_C: tl.constexpr, EVEN_C: tl.constexpr,
):
    pid = tl.program_id(0)
    flat = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    valid = flat < NB
    n = flat // B
    b = flat % B
    p = tl.load(parents_ptr + n, mask=valid & (n >= 1), other=-1)
    parent_ok = (p >= 0) & (p < n)
    p = tl.where(parent_ok, p, n)  # an invalid parent reads the row itself (in bounds), and never folds
    row_off = n.to(tl.int64) * stride_hn + b.to(tl.int64) * stride_hb
    par_off = p.to(tl.int64) * stride_hn + b.to(tl.int64) * stride_hb
    ss_diff = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    ss_par = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        m = valid[:, None] if EVEN_C else valid[:, None] & (cols[None, :] < C)
        x = tl.load(h_ptr + row_off[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
        y = tl.load(h_ptr + par_off[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
        d = x - y
        ss_diff += tl.sum(d * d, axis=1)
        ss_par += tl.sum(y * y, axis=1)
    tau = tl.load(tau_ptr).to(tl.float32)
    # sqrt-norm comparison keeps every edge case: NaN compares False, tau = 0 or a zero parent
    # gives "x < 0" which is False for any x >= 0.
    fold = (tl.sqrt(ss_diff) < tau * tl.sqrt(ss_par)) & (n >= 1) & parent_ok
    tl.store(fold_ptr + flat, fold.to(tl.int8), mask=valid)


@triton.jit
def _resolve_kernel(
    fold_ptr, parents_ptr, origin_ptr, rows_ptr, count_ptr, slot_ptr, fold_out_ptr, invalid_ptr,
    fold_rows_ptr, overflow_ptr, capacity,
    N, B,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, JUMPS: tl.constexpr, WRITE_FOLD: tl.constexpr,
    WRITE_INVALID: tl.constexpr, IN_REGISTERS: tl.constexpr, FOLD_ROWS: tl.constexpr, CAPACITY: tl.constexpr,
):
    rn = tl.arange(0, BLOCK_N)
    rb = tl.arange(0, BLOCK_B)
    valid = (rn[:, None] < N) & (rb[None, :] < B)
    flat = rn[:, None] * B + rb[None, :]                       # int32 flat index n*B+b
    # Row n >= 1 folds only onto a parent in [0, n); row 0 must have parent -1 (it never folds anyway).
    par = tl.load(parents_ptr + rn, mask=rn < N, other=-1)  # int64: compared before any narrowing
    parent_ok = (rn >= 1) & (par >= 0) & (par < rn)
    if WRITE_INVALID:
        bad = (rn < N) & tl.where(rn >= 1, parent_ok == 0, par != -1)
        tl.store(invalid_ptr, 1, mask=tl.sum(bad.to(tl.int32), axis=0) > 0)
    par = tl.where(parent_ok, par, 0).to(tl.int32)
    fold = tl.load(fold_ptr + flat, mask=valid, other=0) != 0
    if FOLD_ROWS:  # rows folded whole whatever their flags (a replayed batch's padding)
        fold = fold | (tl.load(fold_rows_ptr + rn, mask=rn < N, other=0) != 0)[:, None]
    fold = fold & parent_ok[:, None]
    if WRITE_FOLD:  # the gate's own copy of a mask computed elsewhere (row 0 never folds)
        tl.store(fold_out_ptr + flat, fold.to(tl.int8), mask=valid)
    computed = valid & (fold == 0)
    ci = computed.to(tl.int32)
    # exclusive prefix over flat (row-major) order: rows before n, then lanes before b in row n
    in_row = tl.cumsum(ci, axis=1)                              # inclusive within row
    row_tot = tl.sum(ci, axis=1)
    row_excl = tl.cumsum(row_tot, axis=0) - row_tot
    pos = row_excl[:, None] + in_row - 1                        # valid where computed
    count = tl.sum(row_tot, axis=0)

    # Origin by pointer jumping: link[n, b] = the parent row where (n, b) folds, else n (computed rows are
    # fixed points; an origin keeps its position b). After j rounds of link[n, b] = link[link[n, b], b] it
    # points 2^j steps up the fold chain, so JUMPS = ceil(log2(N - 1)) rounds reach the computed end of any
    # chain. Padding rows (n >= N) never fold, so every index stays inside the tile.
    link = tl.where(fold, par[:, None], rn[:, None])
    if IN_REGISTERS:  # the rounds as gathers over the tile, then the slots by one more
        for _ in tl.static_range(JUMPS):
            link = tl.gather(link, link, 0)
        slot = tl.gather(pos, link, 0)
        if CAPACITY:
            slot = tl.minimum(slot, capacity - 1)
        tl.store(origin_ptr + flat, (link * B + rb[None, :]).to(tl.int64), mask=valid)
        tl.store(slot_ptr + flat, slot.to(tl.int64), mask=valid)
    else:  # each round through origin_ptr; the barriers order one round's stores before the next's loads
        link = link * B + rb[None, :]
        for _ in tl.static_range(JUMPS):
            tl.store(origin_ptr + flat, link.to(tl.int64), mask=valid)
            tl.debug_barrier()
            link = tl.load(origin_ptr + link, mask=valid, other=0, cache_modifier=".cg").to(tl.int32)
            tl.debug_barrier()
        tl.store(origin_ptr + flat, link.to(tl.int64), mask=valid)
        # publish the computed rows' positions, then gather them through the origin map
        tl.store(slot_ptr + flat, pos.to(tl.int64), mask=computed)
        tl.debug_barrier()
        slot = tl.load(slot_ptr + link, mask=valid, other=0, cache_modifier=".cg")
        if CAPACITY:
            slot = tl.minimum(slot, capacity - 1)
        tl.debug_barrier()
        tl.store(slot_ptr + flat, slot, mask=valid)
    # compaction: scatter computed flat indices to their positions; zero the tail [count, N*B)
    tl.store(rows_ptr + pos, flat.to(tl.int64), mask=computed)
    tl.store(rows_ptr + flat, tl.zeros([BLOCK_N, BLOCK_B], dtype=tl.int64), mask=valid & (flat >= count))
    tl.store(count_ptr, count.to(tl.int64))
    if CAPACITY:  # set, never cleared: several gates may share one flag
        tl.store(overflow_ptr, 1, mask=count > capacity)


def flag_config(C: int) -> tuple[int, int, int]:
    """(BLOCK_ROWS, BLOCK_C, num_warps) of the flag launch for rows of C channels: a whole row per
    chunk (up to 4096 channels), two rows a program (more where rows are short), two warps. On an H100,
    at C = 1536 and 3584 (1.5B, 7B) and N = 17 / 33, within 5% of the best config of a sweep, where four
    rows in 1024-channel chunks with four warps took 1.23-1.69x as long
    (``python -m bench.kernels.bench_gate --flag-sweep``)."""
    BLOCK_C = min(triton.next_power_of_2(max(C, 1)), 4096)
    return max(2, 2048 // BLOCK_C), BLOCK_C, 2


def _fold_flags(h: torch.Tensor, parents: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    N, B, C = h.shape
    if h.stride(-1) != 1:
        h = h.contiguous()
    fold = _common.empty((N, B), torch.int8, h.device)
    NB = N * B
    if NB == 0:
        return fold.view(torch.bool)
    BLOCK_ROWS, BLOCK_C, num_warps = flag_config(C)
    grid = (triton.cdiv(NB, BLOCK_ROWS),)
    _fold_flag_kernel[grid](
        h, parents, tau, fold, NB, B, C, h.stride(0), h.stride(1),
        BLOCK_ROWS=BLOCK_ROWS, BLOCK_C=BLOCK_C, EVEN_C=C % BLOCK_C == 0, num_warps=num_warps,
    )
    return fold.view(torch.bool)


def resolve_folds(fold: torch.Tensor, parents: torch.Tensor, invalid_flag: torch.Tensor | None = None):
    """Origin map + compaction of a given fold mask [N, B] (bool); row 0 and rows with an invalid parent
    are never folded. ``invalid_flag``: see ``fold_gate``.

    Returns (origin [N,B] int64, rows [N*B] int64, count 0-d int64, slot [N,B] int64).
    """
    return _resolve(fold, parents, write_fold=False, invalid_flag=invalid_flag)[1:]


def fold_gate_from_flags(fold: torch.Tensor, parents: torch.Tensor, invalid_flag: torch.Tensor | None = None, *,
                         fold_rows: torch.Tensor | None = None, capacity: int | None = None,
                         overflow_flag: torch.Tensor | None = None):
    """The gate for fold flags computed elsewhere (e.g. fused by Inductor into the layer's input norm):
    one launch, which also writes the gate's own fold mask (row 0 and rows with an invalid parent
    cleared). Same 5 outputs as ``fold_gate``.

    For a packed batch of fixed size (the serving engine's replayed gates), in the same launch:
    ``fold_rows`` (bool ``[N]``) folds those rows whole whatever their flags (where their parent is
    valid); ``capacity`` (an int >= 1, with ``overflow_flag``, a bool tensor of one element) clamps every
    slot to ``capacity - 1`` and sets the flag when more than ``capacity`` positions are computed (never
    clears it). ``origin``, ``rows`` and ``count`` are unchanged by it. ``gate_ref.fold_gate_from_flags_ref``
    is the reference."""
    return _resolve(fold, parents, write_fold=True, invalid_flag=invalid_flag, fold_rows=fold_rows,
                    capacity=capacity, overflow_flag=overflow_flag)


def _check_invalid_flag(invalid_flag, device) -> None:
    _common.expect(invalid_flag is None or (invalid_flag.numel() == 1 and invalid_flag.dtype == torch.int32
                                            and invalid_flag.device == device),
                   "invalid_flag", f"None or an int32 tensor of one element on {device}",
                   None if invalid_flag is None else f"{invalid_flag.dtype} {tuple(invalid_flag.shape)} on "
                                                     f"{invalid_flag.device}")


def _check_capacity(N: int, dev, fold_rows, capacity, overflow_flag) -> None:
    _common.expect(fold_rows is None or (fold_rows.shape == (N,) and fold_rows.dtype == torch.bool
                                         and fold_rows.device == dev),
                   "fold_rows", f"None or a bool tensor [{N}] on {dev}",
                   None if fold_rows is None else f"{fold_rows.dtype} {tuple(fold_rows.shape)} on {fold_rows.device}")
    _common.expect(capacity is None or (isinstance(capacity, int) and not isinstance(capacity, bool) and capacity >= 1),
                   "capacity", "None or an int >= 1", repr(capacity))
    _common.expect((capacity is None) == (overflow_flag is None), "overflow_flag",
                   "a tensor exactly when capacity is given", f"{type(overflow_flag).__name__} with capacity={capacity!r}")
    _common.expect(overflow_flag is None or (overflow_flag.numel() == 1 and overflow_flag.dtype == torch.bool
                                             and overflow_flag.device == dev and overflow_flag.is_contiguous()),
                   "overflow_flag", f"None or a bool tensor of one element on {dev}",
                   None if overflow_flag is None else f"{overflow_flag.dtype} {tuple(overflow_flag.shape)} on "
                                                      f"{overflow_flag.device}")


def _resolve(fold: torch.Tensor, parents: torch.Tensor, write_fold: bool, invalid_flag: torch.Tensor | None,
             fold_rows: torch.Tensor | None = None, capacity: int | None = None,
             overflow_flag: torch.Tensor | None = None):
    _common.expect(fold.dim() == 2, "fold", "[N, B]", tuple(fold.shape))
    N, B = fold.shape
    _common.expect(parents.dim() == 1 and parents.shape[0] == N, "parents", f"[{N}] (one per branch)",
                   tuple(parents.shape))
    parents = parents.to(device=fold.device, dtype=torch.int64)  # as fold_gate takes them
    dev = fold.device
    _check_invalid_flag(invalid_flag, dev)
    _check_capacity(N, dev, fold_rows, capacity, overflow_flag)
    fold_i8 = fold.contiguous().view(torch.int8) if fold.dtype == torch.bool else fold.to(torch.int8).contiguous()
    origin = _common.empty((N, B), torch.int64, dev)
    slot = _common.empty((N, B), torch.int64, dev)
    rows = _common.empty((N * B), torch.int64, dev)
    count = _common.empty((()), torch.int64, dev)
    parents = parents.contiguous()
    BLOCK_N = max(triton.next_power_of_2(max(N, 1)), 2)
    BLOCK_B = max(triton.next_power_of_2(max(B, 1)), 2)
    jumps = max(N - 2, 0).bit_length()  # ceil(log2(N - 1)): the longest fold chain has N - 1 links
    fold_out = _common.empty((N, B), torch.int8, dev) if write_fold else fold_i8
    _resolve_kernel[(1,)](
        fold_i8, parents, origin, rows, count, slot, fold_out, count if invalid_flag is None else invalid_flag,
        fold_i8 if fold_rows is None else fold_rows.contiguous().view(torch.int8),
        count if overflow_flag is None else overflow_flag.view(torch.int8), 1 if capacity is None else capacity,
        N, B, BLOCK_N=BLOCK_N, BLOCK_B=BLOCK_B, JUMPS=jumps, WRITE_FOLD=write_fold,
        WRITE_INVALID=invalid_flag is not None, IN_REGISTERS=BLOCK_N * BLOCK_B <= REGISTER_TILE_MAX,
        FOLD_ROWS=fold_rows is not None, CAPACITY=capacity is not None, num_warps=4,
    )
    return fold_out.view(torch.bool), origin, rows, count, slot


def fold_gate(h: torch.Tensor, parents: torch.Tensor, tau: torch.Tensor, invalid_flag: torch.Tensor | None = None):
    """Fold gate for h [N, B, C] (fp32/fp16/bf16), parents int64 [N], tau float32 0-d tensor.

    Returns (fold_mask bool [N,B], origin int64 [N,B], rows int64 [N*B], count int64 0-d,
    slot int64 [N,B]). No host synchronisation. A row whose parent is invalid (outside [0, n)) folds
    nothing and no row is read through it; ``invalid_flag`` (int32, one element, on h's device) is then
    set to 1 (``parents[0] != -1`` too), and never cleared.
    """
    _common.expect(h.dim() == 3, "h", "[N, B, C]", tuple(h.shape))
    _common.expect(parents.dim() == 1 and parents.shape[0] == h.shape[0], "parents", f"[{h.shape[0]}] (one per branch)",
                   tuple(parents.shape))
    parents = parents.to(device=h.device, dtype=torch.int64).contiguous()
    tau = tau.to(device=h.device, dtype=torch.float32)
    fold = _fold_flags(h, parents, tau)
    origin, rows, count, slot = resolve_folds(fold, parents, invalid_flag)
    return fold, origin, rows, count, slot
