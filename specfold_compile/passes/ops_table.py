"""Which torch-level ops a fold region may contain, and how each treats the (branch, position) dims.

A region tensor keeps branch and position as its two leading dims ([N, B, ...]); in the packed graph
they become [R, 1, ...] (one row per computed position). An op is position-wise when its output at
(n, b) depends only on its inputs at (n, b): elementwise math, reductions and contractions over
trailing dims, views that leave the two leading dims alone. Everything else is a blocker.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from .. import ops  # noqa: F401
from ..ops import fold_ops  # noqa: F401  (registers the specfold:: custom ops)

# Broadcasting elementwise functions: outside tensor operands are aligned to the right and packed.
ELEMENTWISE_FUNCTIONS = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.pow,
    operator.iadd, operator.isub, operator.imul, operator.itruediv,
    torch.add, torch.sub, torch.mul, torch.div, torch.true_divide, torch.neg, torch.rsqrt, torch.sqrt,
    torch.exp, torch.log, torch.log1p, torch.tanh, torch.sigmoid, torch.pow, torch.where, torch.clamp,
    torch.square, torch.abs, torch.erf, torch.maximum, torch.minimum, torch.reciprocal, torch.cos, torch.sin,
    F.silu, F.gelu, F.relu, F.sigmoid, F.softplus, F.tanh, F.dropout,
}
ELEMENTWISE_METHODS = {
    "add", "sub", "mul", "div", "neg", "pow", "rsqrt", "sqrt", "exp", "log", "log1p", "tanh", "sigmoid",
    "abs", "clamp", "square", "reciprocal", "float", "half", "bfloat16", "double", "contiguous",
    "__add__", "__sub__", "__mul__", "__truediv__", "__radd__", "__rmul__", "__neg__", "__pow__",
}
# Casts whose tensor argument only supplies a dtype/device: never packed.
CAST_METHODS = {"to", "type_as", "type"}

# Every op below that takes dims is classified by the dims bound to its signature (``op_args``), wherever
# the caller put them: ``x.norm(2, 1)`` reduces over dim 1.
REDUCTION_FUNCTIONS = {torch.mean, torch.sum, torch.amax, torch.amin, torch.var, torch.std, torch.logsumexp,
                       torch.linalg.vector_norm, torch.norm}
REDUCTION_METHODS = {"mean", "sum", "amax", "amin", "var", "std", "logsumexp", "norm"}

# Ops along one dim ``dim`` (softmax, scans): position-wise when that dim is trailing.
ALONG_DIM_FUNCTIONS = {torch.softmax, torch.log_softmax, F.softmax, F.log_softmax, torch.cumsum, torch.cumprod}
ALONG_DIM_METHODS = {"softmax", "log_softmax", "cumsum", "cumprod"}

# Ops permuting elements within dims ``dims``: flip (any dims, none = no-op) and roll (no dims = over the
# flattened tensor, which mixes rows).
FLIP_FUNCTIONS, FLIP_METHODS = {torch.flip}, {"flip"}
ROLL_FUNCTIONS, ROLL_METHODS = {torch.roll}, {"roll"}

LINEAR_FUNCTIONS = {F.linear, torch._C._nn.linear}

# Normalisations over a trailing normalized_shape (arg 1).
NORM_FUNCTIONS = {F.layer_norm, torch.layer_norm} | ({F.rms_norm} if hasattr(F, "rms_norm") else set())

VIEW_METHODS = {"view", "reshape"}
VIEW_FUNCTIONS = {torch.reshape}

# Dim-moving ops: allowed when they leave dims 0 and 1 in place.
DIM_METHODS = {"transpose", "permute", "unsqueeze", "squeeze", "flatten", "unflatten"}
DIM_FUNCTIONS = {torch.transpose, torch.permute, torch.unsqueeze, torch.squeeze, torch.flatten, torch.unflatten}

CAT_FUNCTIONS = {torch.cat, torch.concat}

# Ops returning several tensors (fused q/k/v or gate/up projections split apart): allowed along
# trailing dims; their pieces are taken with getitem.
SPLIT_METHODS = {"unbind", "chunk", "split"}
SPLIT_FUNCTIONS = {torch.unbind, torch.chunk, torch.split}

SIZE_METHODS = {"size", "dim"}
SIZE_FUNCTIONS = {torch.ops.aten.sym_size.int} if hasattr(torch.ops.aten, "sym_size") else set()

BRANCH_MARKER = torch.ops.specfold.branches.default
BRANCH_ATTENTION = torch.ops.specfold.branch_attention.default
RESIDUAL_ADDS = {operator.add, operator.iadd, torch.add}

# Ops that mix positions and that we know are attention-like: named in blockers.
KNOWN_MIXING = {F.scaled_dot_product_attention, torch.matmul, torch.bmm}


def target_name(node: torch.fx.Node) -> str:
    t = node.target
    if node.op == "call_method":
        return f"Tensor.{t}"
    return getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or str(t)
