"""Custom ops that the models put into their graphs, so the backend can find the structure.

* ``specfold::branches`` marks where the residual stream enters the first decoder layer and carries
  ``parents``; the backend starts its analysis there. Eager execution never calls it.
* ``specfold::branch_attention`` is the only op that mixes positions: every branch attends to the
  shared prefix cache and, bidirectionally, to its own block. Keeping it one node makes the
  position-wise / mixing split of a decoder layer exact instead of pattern-matched.

Both are ``torch.library.custom_op`` with fake implementations, so a rewritten graph can be traced again.

The package is the floor the backend and the models stand on: ``fold_ops`` (the ops a folded graph
calls), ``stats`` (``collect_stats``), ``device_profile`` (the cost model's per-device numbers). It
imports only ``kernels``.
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
