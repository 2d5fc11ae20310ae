"""The ops a rewritten (folded) graph calls: gate, packing helpers, folded attention, packed linear.

Each is a ``torch.library.custom_op`` with a fake implementation, so the rewritten graph can be traced
again. ``impl="torch"`` runs the readable references of ``kernels/*_ref.py``; ``impl="triton"`` runs
the generated Triton kernels, which never read a value back to the host.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ..kernels.attention_ref import block_attention_ref, prefix_attention_ref
from ..kernels.attention_tuning import AttentionTuning
from ..kernels.gate_ref import fold_gate_ref, resolve_folds_ref, safe_parents, valid_parent_rows
from ..kernels.packed_linear_ref import packed_linear_ref
from ..kernels.swiglu_ref import silu_mul_ref
from . import fold_masks, stats
from .device_profile import H200

IMPLS = ("torch", "triton")


def _kernels():
    from .. import kernels

    if not kernels.triton_available():
        raise RuntimeError("kernels='triton' needs triton (and a GPU, or TRITON_INTERPRET=1)")
    return kernels


# --- invalid parents ------------------------------------------------------------------------------

# One sticky flag per device, set by the gate (on the device, no host read) when a call's parents are
# invalid: parents[0] != -1, or parents[n] outside [0, n). Such a row folds nothing, so it is computed
# exactly as in the dense forward, and no row is read through it; since rows are independent, every
# row's logits are then still the dense forward's (or, for rows with valid parents, folded as usual).
_INVALID_PARENTS: dict[torch.device, Tensor] = {}


def _invalid_parents_flag(device: torch.device) -> Tensor:
    flag = _INVALID_PARENTS.get(device)
    if flag is None:
        with torch.inference_mode(False):  # a normal tensor: updated in and out of inference mode
            flag = torch.zeros(1, dtype=torch.int32, device=device)
        # A flag made while a CUDA graph is being captured would be reset by every replay: not kept.
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            _INVALID_PARENTS[device] = flag
    return flag


def invalid_parents_seen(reset: bool = True) -> bool:
    """Whether a fold gate has seen invalid ``parents`` (``parents[0] != -1`` or ``parents[n]`` outside
    ``[0, n)``) since the last reset, on any device, captured CUDA-graph replays included.

    Eager ``model(...)`` raises on such parents; a compiled call cannot check them without reading them
    back to the host, so its gates compute the rows with an invalid parent instead of folding them (their
    logits are the dense forward's) and set this flag. Reads the flags back (a host synchronisation): call
    it where one is allowed, e.g. after a decode loop. ``collect_stats()`` counts such calls too
    (``FoldStats.invalid_parent_calls``)."""
    seen = False
    for flag in _INVALID_PARENTS.values():
        seen |= bool(flag.item())
        if reset:
            flag.zero_()
    return seen


# --- gate + origin + compaction ------------------------------------------------------------------

def fold_flags_graph(h: Tensor, parents: Tensor, tau: Tensor) -> Tensor:
    """The gate's fold flags as plain tensor ops (``options["gate_flags"]="graph"``): SPEC section 2's
    ``||h[n,b] - h[p(n),b]|| < tau * ||h[p(n),b]||`` in float32, row 0 never folded.

    Put in the graph before the gate, these are a row-wise reduction over the same rows as the
    layer's input norm, which Inductor can fuse with it, instead of a separate pass over h.
    """
    hf = h.float()
    hp = hf.index_select(0, safe_parents(parents))  # an invalid parent reads the row itself, never folds
    ss_diff = (hf - hp).square().sum(-1)
    ss_par = hp.square().sum(-1)
    return (ss_diff.sqrt() < tau * ss_par.sqrt()) & valid_parent_rows(parents)[:, None]


@torch.library.custom_op("specfold::fold_gate", mutates_args=())
def fold_gate(h: Tensor, parents: Tensor, tau: Tensor, gate_index: int, pack: bool, impl: str,
              flags: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """h [N, B, C] -> (fold_mask [N,B] bool, origin [N,B], rows [N*B], count [], slot [N,B]) (int64).

    ``rows[:count]`` are the computed rows (flat n*B+b, ascending), ``slot[n,b]`` indexes ``rows`` at the
    origin of (n, b). With ``pack=False`` every row is "computed" for the position-wise ops
    (rows = arange, count = N*B) and ``slot = origin``: same results, no savings (a bisection switch).
    ``flags`` ([N, B] bool, from ``fold_flags_graph``): the fold flags, computed in the graph; the gate
    then only resolves origins and compacts.

    Rows whose parent is invalid fold nothing (``invalid_parents_seen``).
    """
    invalid = _invalid_parents_flag(h.device)
    forced = fold_masks.forced_flags(gate_index, h.shape[0], h.shape[1])
    if forced is not None:  # a trace-driven benchmark's recorded masks (``fold_masks``)
        flags = forced
    if flags is not None:
        if impl == "triton":
            fold, origin, rows, count, slot = _kernels().fold_gate_from_flags(flags, parents, invalid)
        else:
            fold = flags & valid_parent_rows(parents)[:, None]
            origin, rows, count, slot = resolve_folds_ref(fold, parents, invalid)
    elif impl == "triton":
        fold, origin, rows, count, slot = _kernels().fold_gate(h, parents, tau, invalid)
    else:
        fold, origin, rows, count, slot = fold_gate_ref(h, parents, tau, invalid)
    if not pack:
        n_flat = h.shape[0] * h.shape[1]
        rows = torch.arange(n_flat, device=h.device, dtype=torch.int64)
        count = torch.full((), n_flat, device=h.device, dtype=torch.int64)
        slot = origin.clone()
    stats.record_gate(gate_index, fold, parents)
    fold_masks.record(gate_index, fold)
    return fold, origin, rows, count, slot


@fold_gate.register_fake
def _fold_gate_fake(h, parents, tau, gate_index, pack, impl, flags=None):
    n, b = h.shape[0], h.shape[1]
    mask = h.new_empty((n, b), dtype=torch.bool)
    idx = h.new_empty((n, b), dtype=torch.int64)
    return mask, idx, h.new_empty((n * b,), dtype=torch.int64), h.new_empty((), dtype=torch.int64), idx.clone()


# --- packing (plain torch: one gather each, no host sync) ----------------------------------------

def pack_rows(x: Tensor, rows: Tensor) -> Tensor:
    """[N, B, ...] -> [R, 1, ...]: the rows ``rows`` (flat n*B+b), each as a branch of one position."""
    return x.flatten(0, 1).index_select(0, rows).unsqueeze(1)


def unpack_rows(x_p: Tensor, slot: Tensor) -> Tensor:
    """[R, 1, ...] -> [N, B, ...]: every (n, b) reads its origin's packed row (no copy of the parent's
    tensors beyond this gather)."""
    n, b = slot.shape
    return x_p.squeeze(1).index_select(0, slot.flatten()).unflatten(0, (n, b))


def pack_external(t: Tensor, out_rank: int, row_branch: Tensor, row_pos: Tensor) -> Tensor:
    """Pack a tensor from outside a region (e.g. RoPE tables [B, 1, D]) that broadcasts against region
    tensors of rank ``out_rank`` laid out [N, B, ...]: -> [R, 1, ...], row r taking branch
    ``row_branch[r]`` and position ``row_pos[r]`` (the pass only calls this when it varies with either)."""
    t = t.reshape((1,) * (out_rank - t.dim()) + tuple(t.shape))
    if t.shape[0] != 1 and t.shape[1] != 1:
        return t[row_branch, row_pos].unsqueeze(1)
    if t.shape[1] != 1:
        return t[0].index_select(0, row_pos).unsqueeze(1)
    return t[:, 0].index_select(0, row_branch).unsqueeze(1)


# --- folded attention ------------------------------------------------------------------------------

@torch.library.custom_op("specfold::folded_attention", mutates_args=())
def folded_attention(q_p: Tensor, k_p: Tensor, v_p: Tensor, k_pre: Tensor, v_pre: Tensor, slot: Tensor,
                     count: Tensor, scale: float, impl: str, prefix_len: Optional[Tensor] = None,
                     one_pass_max_prefix: int = H200.one_pass_max_prefix,
                     one_pass_max_work: int = H200.one_pass_max_work,
                     split_tile_us: float = H200.split_tile_us,
                     split_merge_us: float = H200.split_merge_us,
                     split_merge_us_per_row_head: float = H200.split_merge_us_per_row_head,
                     programs_per_sm: int = H200.programs_per_sm,
                     folded_rows_guess: float = H200.folded_rows_guess,
                     min_split_prefix: int = H200.min_split_prefix) -> Tensor:
    """Packed q/k/v [R, 1, H, D] -> attention output [N, B, Hq, D] for every row. ``prefix_len``: as in
    ``specfold::branch_attention`` (the valid keys of a static cache; None = all). The arguments after it
    are the Triton launchers' ``AttentionTuning`` (``Tuning.folded_attention_args()``; defaults: the
    H200 profile).

    The prefix state (o, lse) is computed once per computed row; each (n, b) merges the prefix state of
    its origin with its attention over its own branch's block keys (read through ``slot``). The Triton
    path does exactly that except for short prefixes and few rows (``kernels.slot_attention``), where one
    launch walks the prefix again for every row: the same values, cheaper there than two launches.
    """
    q, k, v = q_p.squeeze(1), k_p.squeeze(1), v_p.squeeze(1)
    if impl == "triton":
        tuning = AttentionTuning.from_fields(locals())
        return _kernels().slot_attention(q, k, v, slot, k_pre, v_pre, scale, count, prefix_len=prefix_len,
                                         tuning=tuning)
    n_computed = int(count)  # the reference may read the count; the Triton path never does
    o_pre, lse_pre = prefix_attention_ref(q[:n_computed], k_pre, v_pre, scale, prefix_len=prefix_len)
    pad = q.shape[0] - n_computed
    if pad:
        o_pre = torch.cat((o_pre, o_pre.new_zeros((pad,) + o_pre.shape[1:])))
        lse_pre = torch.cat((lse_pre, lse_pre.new_full((pad,) + lse_pre.shape[1:], float("-inf"))))
    return block_attention_ref(q, k, v, slot, o_pre, lse_pre, scale)


@folded_attention.register_fake
def _folded_attention_fake(q_p, k_p, v_p, k_pre, v_pre, slot, count, scale, impl, prefix_len=None, *tuning,
                           **tuning_kw):
    n, b = slot.shape
    return q_p.new_empty((n, b, q_p.shape[-2], q_p.shape[-1]))


# --- packed linear -------------------------------------------------------------------------------

def _gemm_us(rows: int, k: int, m: int, itemsize: int, costs) -> float:
    """One GEMM's roofline time on the device of ``costs`` (a DeviceProfile or a Tuning), only to estimate
    what the rows past the cuBLAS head would add if cuBLAS took them too (``min_spill_us``)."""
    return 1e6 * max(k * m * itemsize / costs.gemm_bytes_per_s, 2.0 * rows * k * m / costs.gemm_flops_per_s)


def dense_rows(rows: int, dense_fraction: float, weight_shape: tuple[int, int] | None = None,
               min_spill_us: float = 0.0, itemsize: int = 2, costs=H200) -> int:
    """How many leading packed rows a packed linear hands to cuBLAS (a shape-only decision): at least
    ``costs.dense_linear_min_rows`` (below the ridge, fewer rows save nothing), a multiple of
    ``costs.dense_linear_row_multiple``, at most ``rows``.

    With ``min_spill_us > 0`` and the weight's ``(out, in)`` shape: every row, when cuBLAS on all rows is
    estimated to cost less than ``min_spill_us`` more than on the head alone, since the spill launch
    costs about that much even when it has nothing to do (small weights: k/v projections, tiny models).
    ``costs``: the device numbers (a DeviceProfile, or the backend's Tuning, which has the same fields).
    """
    if dense_fraction >= 1.0:
        return rows
    step = costs.dense_linear_row_multiple
    want = max(costs.dense_linear_min_rows, -(-math.ceil(dense_fraction * rows) // step) * step)
    head = min(rows, want)
    if head < rows and min_spill_us > 0 and weight_shape is not None:
        m, k = weight_shape
        if _gemm_us(rows, k, m, itemsize, costs) - _gemm_us(head, k, m, itemsize, costs) < min_spill_us:
            return rows
    return head


def layer_dense_fraction(dense_fraction: float | tuple[float, ...], layer: int, layers: int) -> float:
    """The head fraction of gated region ``layer`` of ``layers``: ``dense_fraction`` itself, or for a
    sequence (a profile over the depth) entry ``layer * len // layers``; a region past the layers (the
    LM head's) takes the last entry."""
    if not isinstance(dense_fraction, tuple):
        return dense_fraction
    return dense_fraction[min(layer * len(dense_fraction) // max(layers, 1), len(dense_fraction) - 1)]


def fold_saving_us(rows: int, weight_shapes: list[tuple[int, int]], dense_fraction: float,
                   min_spill_us: float = 0.0, itemsize: int = 2, costs=H200) -> float:
    """Estimated microseconds the packed linears save on a graph of ``rows`` (= N * B) rows: cuBLAS on
    every row minus cuBLAS on the head alone (``dense_rows``), summed over ``weight_shapes`` ((out, in)
    each), when the computed rows fit in the head. Zero while all rows are bandwidth-bound (every row
    reads the same weights); attention's saving is left out (it only makes folding pay earlier). The
    backend's cost model (``backend/dispatch.py``) weighs it against ``costs.fold_overhead_us`` a layer."""
    saving = 0.0
    for m, k in weight_shapes:
        head = dense_rows(rows, dense_fraction, (m, k), min_spill_us, itemsize, costs)
        saving += _gemm_us(rows, k, m, itemsize, costs) - _gemm_us(head, k, m, itemsize, costs)
    return saving


@torch.library.custom_op("specfold::packed_linear", mutates_args=())
def packed_linear(x: Tensor, weight: Tensor, bias: Tensor | None, count: Tensor, dense_fraction: float,
                  impl: str, min_spill_us: float = 0.0,
                  packed_linear_min_block_r: int = H200.packed_linear_min_block_r,
                  dense_linear_min_rows: int = H200.dense_linear_min_rows,
                  dense_linear_row_multiple: int = H200.dense_linear_row_multiple,
                  gemm_bytes_per_s: float = H200.gemm_bytes_per_s,
                  gemm_flops_per_s: float = H200.gemm_flops_per_s) -> Tensor:
    """``F.linear`` on the first ``count`` packed rows; the work shrinks with the recompute ratio.

    Triton impl: the first ``dense_rows(R, dense_fraction)`` rows go to cuBLAS unconditionally (its
    GEMMs are faster than ours, and the computed rows usually fit); the rest spill to the count-aware
    Triton GEMM, whose row tiles past the device-side ``count`` exit at once. No host sync either way.
    The keyword arguments after ``min_spill_us`` are the device numbers of ``dense_rows`` and the spill
    kernel's row-tile bound (``Tuning.packed_linear_args()``; defaults: the H200 profile).
    """
    if impl == "triton":
        costs = H200.replace(dense_linear_min_rows=dense_linear_min_rows,
                             dense_linear_row_multiple=dense_linear_row_multiple,
                             gemm_bytes_per_s=gemm_bytes_per_s, gemm_flops_per_s=gemm_flops_per_s)
        rows, k = x.shape[0], x.shape[-1]
        head = dense_rows(rows, dense_fraction, tuple(weight.shape), min_spill_us, x.element_size(), costs)
        if head == rows:
            return torch.nn.functional.linear(x, weight, bias)
        x2 = x.reshape(rows, k)
        y = x.new_empty((rows, weight.shape[0]))
        if head:
            if bias is None:
                torch.mm(x2[:head], weight.t(), out=y[:head])
            else:
                torch.addmm(bias, x2[:head], weight.t(), out=y[:head])
        _kernels().packed_linear(x2, weight, bias, count, min_block_r=packed_linear_min_block_r, row_start=head,
                                 out=y)
        return y.view(tuple(x.shape[:-1]) + (weight.shape[0],))
    n_computed = int(count)  # the reference may read the count; the Triton path never does
    y = x.new_zeros(tuple(x.shape[:-1]) + (weight.shape[0],))
    y[:n_computed] = packed_linear_ref(x[:n_computed], weight, bias)
    return y


@packed_linear.register_fake
def _packed_linear_fake(x, weight, bias, count, dense_fraction, impl, min_spill_us=0.0, *tuning, **tuning_kw):
    return x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))


# --- packed SwiGLU activation --------------------------------------------------------------------

@torch.library.custom_op("specfold::packed_silu_mul", mutates_args=())
def packed_silu_mul(gate: Tensor, up: Tensor, count: Tensor, impl: str) -> Tensor:
    """silu(gate) * up on the first ``count`` packed rows (rows past it are unspecified with the Triton
    kernel, which skips them; the reference computes every row). fp32 arithmetic, one rounding."""
    if impl == "triton":
        return _kernels().silu_mul(gate, up, count)
    return silu_mul_ref(gate, up)


@packed_silu_mul.register_fake
def _packed_silu_mul_fake(gate, up, count, impl):
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


# Graph targets (OpOverloads) used by the passes.
FOLD_GATE = torch.ops.specfold.fold_gate.default
FOLDED_ATTENTION = torch.ops.specfold.folded_attention.default
PACKED_LINEAR = torch.ops.specfold.packed_linear.default
PACKED_SILU_MUL = torch.ops.specfold.packed_silu_mul.default
