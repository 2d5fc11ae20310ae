"""Custom ops that the models put into their graphs, so the backend can find the structure.

* ``specfold::branches`` marks where the residual stream enters the first decoder layer and carries
  ``parents``; the backend starts its analysis there. Eager execution never calls it.
* ``specfold::branch_attention`` is the only op that mixes positions: every branch attends to the
  shared prefix cache and, bidirectionally, to its own block. Keeping it one node makes the
  position-wise / mixing split of a decoder layer exact instead of pattern-matched.
* ``specfold::ragged_attention`` is the serving engine's batched form of it: the concatenated rows of
  several requests, each request's rows against its own prefix in the ``KVPool`` (slot and length per
  request, device tensors), in one launch, two for a split prefix (``kernels/ragged_attention.py``);
  ``specfold::folded_ragged_attention`` the same for a folded forward, read from its packed rows (each
  computed position's prefix walked once, ``kernels/folded_ragged_attention.py``).

All are ``torch.library.custom_op`` with fake implementations, so a rewritten graph can be traced again.

The package is the floor the backend and the models stand on: ``fold_ops`` (the ops a folded graph
calls), ``stats`` (``collect_stats``), ``device_profile`` (the cost model's per-device numbers), and
``resolve_folds_packed``, a plain function: the fold gate's origin resolution and packing of a given mask
in one Triton launch, for the serving engine's replayed gates (``serving/capacity_gates.py``). It imports
only ``kernels``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import kernels
from .device_profile import H200


@torch.library.custom_op("specfold::branches", mutates_args=())
def branches(h: Tensor, parents: Tensor) -> Tensor:
    """Identity on ``h``; the ``parents`` edge is what the compiler reads."""
    return h.clone()


@branches.register_fake
def _branches_fake(h: Tensor, parents: Tensor) -> Tensor:
    return torch.empty_like(h)


def mark_branches(h: Tensor, parents: Tensor) -> Tensor:
    """Insert the branch marker while being traced by torch.compile; free in eager mode."""
    if torch.compiler.is_compiling():
        return branches(h, parents)
    return h


@torch.library.custom_op("specfold::branch_attention", mutates_args=())
def branch_attention(q: Tensor, k: Tensor, v: Tensor, k_pre: Tensor, v_pre: Tensor, scale: float,
                     prefix_len: Optional[Tensor] = None) -> Tensor:
    """Dense multi-branch attention.

    q: [N, B, Hq, D]; k, v: [N, B, Hkv, D] (each branch's own block); k_pre, v_pre: [Hkv, P, D], the
    shared prefix cache, read by every branch without a per-branch copy. Returns [N, B, Hq, D].
    ``prefix_len`` (an integer device tensor of one element, or None = all P keys): only the first
    ``prefix_len`` keys of the cache are the prefix, the rest is unused capacity (a static cache, whose
    length changes between CUDA-graph replays without changing any shape).
    """
    if q.is_cuda and kernels.triton_available():  # (the model's op: the default device profile's launches)
        return kernels.branch_attention(q, k, v, k_pre, v_pre, scale, prefix_len=prefix_len, tuning=H200.attention)
    return kernels.branch_attention_ref(q, k, v, k_pre, v_pre, scale, prefix_len=prefix_len)


@branch_attention.register_fake
def _branch_attention_fake(q, k, v, k_pre, v_pre, scale, prefix_len=None):
    return torch.empty_like(q)


def triton_runs(device: torch.device) -> bool:
    """Whether the Triton kernels run on tensors of ``device``: a CUDA device, or the interpreter
    (TRITON_INTERPRET=1) on the CPU."""
    return kernels.triton_available() and (device.type == "cuda" or kernels.interpreting())


def resolve_folds_packed(fold: Tensor, parents: Tensor, fold_rows: Tensor | None = None, capacity: int | None = None,
                         overflow_flag: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A fold mask (bool ``[N, B]``) resolved and packed in one Triton launch (``kernels.fold_gate_from_flags``;
    ``triton_runs`` must hold): the mask with ``fold_rows`` (bool ``[N]``, optional) folded whole and the
    rows of no valid parent cleared, the computed positions first (flat, int64 ``[N * B]``, the tail
    zeroed), their count (0-d) and every position's slot among them (its origin's), ``[N, B]``. With
    ``capacity`` (a packed batch of that many positions), the slots are clamped to ``capacity - 1`` and
    ``overflow_flag`` (bool, one element) is set when more positions are computed. No host read."""
    fold, _, rows, count, slot = kernels.fold_gate_from_flags(fold, parents, fold_rows=fold_rows, capacity=capacity,
                                                              overflow_flag=overflow_flag)
    return fold, rows, count, slot


@torch.library.custom_op("specfold::ragged_attention", mutates_args=())
def ragged_attention(q: Tensor, k: Tensor, v: Tensor, k_pool: Tensor, v_pool: Tensor, bounds: Tensor,
                     slots: Tensor, lengths: Tensor, scale: float, causal: bool = False) -> Tensor:
    """Branch attention of several requests' rows at once, each against its own pool prefix.

    q: [R, B, Hq, D], k, v: [R, B, Hkv, D], the rows of all requests concatenated, request ``i`` owning
    rows ``[bounds[i], bounds[i + 1])``; k_pool, v_pool: [S, Hkv, C, D], one layer of the ``KVPool``, read
    in place; slots, lengths: [n], each request's slot and prefix length (integer device tensors, never
    read back by the kernel). Each row attends to its request's first ``lengths[i]`` prefix keys and,
    bidirectionally (``causal``: causally), to its own block. Returns [R, B, Hq, D]: per request, what
    ``branch_attention`` gives on that request's rows and prefix alone.

    The Triton kernel runs on CUDA (its prefix split count from the default device profile) and under
    the interpreter (TRITON_INTERPRET=1); elsewhere (the CPU) the pure-torch reference does.
    """
    if triton_runs(q.device):
        return kernels.ragged_attention(q, k, v, k_pool, v_pool, bounds, slots, lengths, scale, causal,
                                        tuning=H200.attention)
    return kernels.ragged_attention_ref(q, k, v, k_pool, v_pool, bounds, slots, lengths, scale, causal)


@ragged_attention.register_fake
def _ragged_attention_fake(q, k, v, k_pool, v_pool, bounds, slots, lengths, scale, causal=False):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op("specfold::folded_ragged_attention", mutates_args=())
def folded_ragged_attention(q_p: Tensor, k_p: Tensor, v_p: Tensor, rows: Tensor, slot: Tensor, k_pool: Tensor,
                            v_pool: Tensor, bounds: Tensor, slots: Tensor, lengths: Tensor, scale: float) -> Tensor:
    """``ragged_attention`` of a folded forward, read from its packed rows: q_p [P, Hq, D], k_p, v_p
    [P, Hkv, D] the computed positions' q, k, v (``rows`` [P]: each one's flat position ``n * B + b``,
    zeros past the computed count, as the gates pack them), ``slot`` [R, B] the packed row every position
    takes (its origin's); the rest as ``ragged_attention``.
    Returns [R, B, Hq, D], ``ragged_attention(q_p[slot], k_p[slot], v_p[slot], ...)`` up to rounding:
    each packed row's prefix is walked once (a folded position's prefix state is its origin's), then every
    position's own branch block is merged in (``kernels/folded_ragged_attention.py``; two launches).

    The Triton kernels run on CUDA and under the interpreter; elsewhere the pure-torch twin does."""
    if triton_runs(q_p.device):
        return kernels.folded_ragged_attention(q_p, k_p, v_p, rows, slot, k_pool, v_pool, bounds, slots, lengths,
                                               scale, tuning=H200.attention)
    return kernels.folded_ragged_attention_ref(q_p, k_p, v_p, rows, slot, k_pool, v_pool, bounds, slots, lengths,
                                               scale)


@folded_ragged_attention.register_fake
def _folded_ragged_attention_fake(q_p, k_p, v_p, rows, slot, k_pool, v_pool, bounds, slots, lengths, scale):
    return q_p.new_empty((slot.shape[0], slot.shape[1], q_p.shape[1], q_p.shape[2]))
