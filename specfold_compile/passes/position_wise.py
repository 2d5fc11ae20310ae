"""Is an op position-wise? The per-node checks of the analysis, and which outside values may enter a region.

A region tensor keeps (branch, position) as its two leading dims ([N, B, ...]); packing turns them into
[R, 1, ...], one computed row each. ``check_region_node`` accepts an op only when its output at (n, b)
depends on its inputs at (n, b) alone; every dim an op touches is read from its arguments bound to its
signature (``op_args``), and an op whose dims cannot be determined is rejected.

``OutsideValues`` decides which values computed outside a region may enter it (SPEC section 2 assumes
that a row's region output depends on its own residual row only: that is what the gate compares).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import Node

from . import ops_table as T
from .ops_table import target_name
from .op_args import bound_arguments, first_argument


def shape_of(node: Any) -> tuple | None:
    if not isinstance(node, Node):
        return None
    v = node.meta.get("example_value", node.meta.get("val"))
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _norm_dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _dims(value: Any, rank: int) -> list[int] | None:
    """A dim argument (an int or a list of ints) as non-negative dims; None when one is not a constant."""
    dims = value if isinstance(value, (tuple, list)) else (value,)
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return None
    return [_norm_dim(d, rank) for d in dims]


def _trailing(value: Any, rank: int) -> bool:
    """Every dim of ``value`` is a constant past (branch, position)."""
    dims = _dims(value, rank)
    return dims is not None and all(d >= 2 for d in dims)


def _bound(node: Node) -> tuple[dict[str, Any] | None, str]:
    bound = bound_arguments(node)
    why = f"{target_name(node)}: its arguments match no single signature, so its dims are unknown"
    return bound, why


def _check_norm(node: Node) -> str | None:
    bound, why = _bound(node)
    if bound is None:
        return why
    src, shape = shape_of(first_argument(bound)), bound.get("normalized_shape")
    if src is None or shape is None:
        return "normalisation of unknown shape"
    n_norm = len(shape) if isinstance(shape, (tuple, list)) else 1
    return None if len(src) - n_norm >= 2 else "normalisation over the branch/position dims"


def _check_cat(node: Node) -> str | None:
    bound, why = _bound(node)
    if bound is None:
        return why
    shape = shape_of(node)
    if shape is None:
        return "cat of unknown shape"
    return None if _trailing(bound.get("dim", 0), len(shape)) else "cat along the branch/position dims"


def _check_reduction(node: Node) -> str | None:
    bound, why = _bound(node)
    if bound is None:
        return why
    src, dim = shape_of(first_argument(bound)), bound.get("dim")
    if src is None:
        return f"{target_name(node)} of unknown shape"
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):  # no dim, or [] = every dim
        return f"{target_name(node)} over all dims (needs an explicit trailing dim)"
    if not _trailing(dim, len(src)):
        return f"{target_name(node)} reduces over the branch/position dims (dim={dim!r})"
    return None


def _check_along_dim(node: Node) -> str | None:
    """softmax, log_softmax, cumsum, cumprod: along one constant trailing ``dim``."""
    bound, why = _bound(node)
    if bound is None:
        return why
    src, dim = shape_of(first_argument(bound)), bound.get("dim")
    if src is None:
        return f"{target_name(node)} of unknown shape"
    if not isinstance(dim, int) or not _trailing(dim, len(src)):
        return f"{target_name(node)} along the branch/position dims (dim={dim!r})"
    return None


def _check_permuting(node: Node, needs_dims: bool) -> str | None:
    """flip / roll: they move elements within ``dims``; roll without dims moves them across the whole
    (flattened) tensor."""
    bound, why = _bound(node)
    if bound is None:
        return why
    src, dims = shape_of(first_argument(bound)), bound.get("dims")
    if src is None:
        return f"{target_name(node)} of unknown shape"
    if (needs_dims and not dims) or not _trailing(dims if dims is not None else [], len(src)):
        return f"{target_name(node)} moves elements along the branch/position dims (dims={dims!r})"
    return None


def _check_elementwise(node: Node, region: set[Node]) -> str | None:
    out = shape_of(node)
    if out is None:
        return "elementwise op of unknown shape"
    for arg in node.all_input_nodes:
        if arg in region and (shape_of(arg) is None or len(shape_of(arg)) != len(out)):
            return "elementwise op broadcasts a region value to a higher rank"
    return None


def view_shape_args(node: Node) -> list:
    args = list(node.args[1:])
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return list(args[0])
    if not args and "shape" in node.kwargs:
        return list(node.kwargs["shape"])
    return args


def _check_view(node: Node) -> str | None:
    src, out = shape_of(node.args[0]), shape_of(node)
    if src is None or out is None or len(src) < 2 or len(out) < 2:
        return "view of unknown shape"
    if str(src[0]) != str(out[0]) or str(src[1]) != str(out[1]):
        return "view/reshape changes the branch/position dims"
    if len(view_shape_args(node)) != len(out):
        return "view/reshape with an unexpected shape argument"
    return None


def _check_dim_op(node: Node) -> str | None:
    """Dim-moving ops are fine when they leave dims 0 and 1 (branch, position) where they are."""
    bound, why = _bound(node)
    if bound is None:
        return why
    src, out = shape_of(first_argument(bound)), shape_of(node)
    if src is None or out is None or len(src) < 2 or len(out) < 2:
        return "dim op of unknown shape"
    name = node.target if isinstance(node.target, str) else node.target.__name__
    rank = len(src)
    if name == "transpose":
        ok = _trailing([bound.get("dim0"), bound.get("dim1")], rank)
    elif name == "permute":
        perm = _dims(bound.get("dims"), rank)
        ok = perm is not None and perm[:2] == [0, 1]
    elif name == "unsqueeze":
        ok = _trailing(bound.get("dim"), len(out))
    elif name == "squeeze":
        ok = bound.get("dim") is not None and _trailing(bound["dim"], rank)
    elif name == "flatten":
        ok = _trailing(bound.get("start_dim", 0), rank)
    elif name == "unflatten":
        ok = _trailing(bound.get("dim"), rank)
    else:
        return f"{name} is not supported in a region"
    return None if ok else f"{name} moves the branch/position dims"


def _check_split(node: Node) -> str | None:
    bound, why = _bound(node)
    if bound is None:
        return why
    name = node.target if isinstance(node.target, str) else node.target.__name__
    src = shape_of(first_argument(bound))
    if src is None:
        return f"{name} of unknown shape"
    return None if _trailing(bound.get("dim", 0), len(src)) else f"{name} splits the branch/position dims"


def _check_getitem(node: Node) -> str | None:
    if isinstance(node.args[0], Node) and isinstance(node.args[0].meta.get("example_value"), (tuple, list)):
        return None if isinstance(node.args[1], int) else "indexing a tuple with a non-int"
    src = shape_of(node.args[0])
    if src is None:
        return None if not isinstance(node.args[0], Node) or shape_of(node) is None else "indexing of unknown shape"
    index = node.args[1]
    index = index if isinstance(index, tuple) else (index,)
    if index and index[0] is Ellipsis:
        explicit = sum(1 for i in index[1:] if i is not None)
        return None if len(src) - explicit >= 2 and all(i is not None for i in index[1:]) else \
            "indexing touches the branch/position dims"
    lead = list(index[:2]) + [slice(None)] * (2 - len(index[:2]))
    if all(isinstance(i, slice) and i == slice(None) for i in lead):
        return None
    return "indexing touches the branch/position dims"


def _check_size(node: Node, region: set[Node]) -> str | None:
    # A size read from a region tensor is only safe as the (overridden) leading view arguments.
    for user in node.users:
        if user not in region or not (user.target in T.VIEW_METHODS or user.target in T.VIEW_FUNCTIONS):
            return "size of a region tensor used outside a view"
    return None


# (methods, functions, checker(node, region)) for every kind of op a region may hold.
_CHECKS = (
    (T.ELEMENTWISE_METHODS, T.ELEMENTWISE_FUNCTIONS, _check_elementwise),
    (T.CAST_METHODS, set(), lambda n, r: None),
    (set(), T.LINEAR_FUNCTIONS, lambda n, r: None),
    (set(), T.NORM_FUNCTIONS, lambda n, r: _check_norm(n)),
    (T.REDUCTION_METHODS, T.REDUCTION_FUNCTIONS, lambda n, r: _check_reduction(n)),
    (T.ALONG_DIM_METHODS, T.ALONG_DIM_FUNCTIONS, lambda n, r: _check_along_dim(n)),
    (T.FLIP_METHODS, T.FLIP_FUNCTIONS, lambda n, r: _check_permuting(n, needs_dims=False)),
    (T.ROLL_METHODS, T.ROLL_FUNCTIONS, lambda n, r: _check_permuting(n, needs_dims=True)),
    (T.VIEW_METHODS, T.VIEW_FUNCTIONS, lambda n, r: _check_view(n)),
    (T.DIM_METHODS, T.DIM_FUNCTIONS, lambda n, r: _check_dim_op(n)),
    (set(), T.CAT_FUNCTIONS, lambda n, r: _check_cat(n)),
    (set(), {operator.getitem}, lambda n, r: _check_getitem(n)),
    (T.SIZE_METHODS, T.SIZE_FUNCTIONS, _check_size),
    (T.SPLIT_METHODS, T.SPLIT_FUNCTIONS, lambda n, r: _check_split(n)),
)


def check_region_node(node: Node, region: set[Node]) -> str | None:
    """None when ``node`` is position-wise with (branch, position) leading; else the reason."""
    if node.op not in ("call_method", "call_function"):
        return f"{node.op} node inside a region"
    for methods, functions, check in _CHECKS:
        if node.target in (methods if node.op == "call_method" else functions):
            return check(node, region)
    if node.op == "call_function" and (node.target is T.BRANCH_ATTENTION or node.target in T.KNOWN_MIXING):
        return f"{target_name(node)} mixes positions inside a position-wise region"
    return f"{target_name(node)} is not known to be position-wise"


def broadcasts(node: Node) -> bool:
    """Elementwise ops and cat: every tensor operand is aligned to the right and read row by row."""
    methods = node.op == "call_method"
    return (node.target in T.ELEMENTWISE_METHODS) if methods else \
        (node.target in T.ELEMENTWISE_FUNCTIONS or node.target in T.CAT_FUNCTIONS)


def varies_with_branch(value: Node, out_shape: tuple | None) -> bool:
    """Whether ``value``, broadcast against an output of ``out_shape`` laid out [N, B, ...], can differ
    between branches (unknown shapes: yes)."""
    shape = shape_of(value)
    if shape is None or out_shape is None or len(shape) > len(out_shape):
        return True
    return len(shape) == len(out_shape) and not (isinstance(shape[0], int) and shape[0] == 1)


class OutsideValues:
    """Which values from outside a packed region may enter it, and why not.

    A packed region computes row r from its entry's row r and, for a value from outside, either that
    value's row r (``pack_external``: elementwise operands) or the whole value (weights, a cast's dtype
    source). A folded row takes its origin's result: right only when that result depends on nothing the
    gate does not compare, i.e. on the rows at its own position. So an outside value must be

    * read whole (a weight) and computed without the residual stream, or
    * read row by row and the same for every branch (RoPE tables: a row and its origin sit at the same
      position, so they read the same table row), or
    * computed position-wise, op by op, from the residual stream (``stream``: the marker, every layer's
      input and mid-layer sum) or from graph inputs and parameters.

    A token shift (``cat((h[:, :1], h[:, :-1]), 1)``) or a cumsum over positions fed to the MLP fails
    the last: its row (n, b) reads h[n, b - 1], which the gate at (n, b) never compares.
    """

    def __init__(self, marker: Node, marker_descendants: set[Node]) -> None:
        self.stream: set[Node] = {marker}
        self.dependent = marker_descendants | {marker}  # computed from the residual stream
        self._reasons: dict[Node, str | None] = {}

    def operand_reason(self, user: Node, value: Node) -> str | None:
        """None when ``value`` (not a region value) may be an operand of the region op ``user``."""
        need = self._need(user, value)
        if need == "whole":
            return f"{value.name!r}, computed from the residual stream, is read whole by {user.name!r}"
        return self.proof_reason(value) if need == "prove" else None

    def _need(self, user: Node, value: Node) -> str:
        """"ok", "prove" (must be position-wise back to the stream or graph inputs) or "whole" (a value of
        the residual stream read whole: it mixes rows)."""
        v = value.meta.get("example_value", value.meta.get("val"))
        if not isinstance(v, (torch.Tensor, tuple, list)):  # a size or a flag
            return "ok"
        row_wise = broadcasts(user) or (bool(user.args) and user.args[0] is value)
        if not row_wise:
            if user.op == "call_method" and user.target in T.CAST_METHODS:
                return "ok"  # supplies a dtype only
            return "whole" if value in self.dependent else "ok"
        if value in self.dependent or varies_with_branch(value, shape_of(user)):
            return "prove"
        return "ok"

    def proof_reason(self, start: Node) -> str | None:
        """None when ``start`` is computed position-wise from the stream, graph inputs and parameters."""
        if start in self._reasons:
            return self._reasons[start]
        todo, seen, reason = [start], set(), None
        while todo and reason is None:
            node = todo.pop()
            if node in seen or node in self.stream or node.op in ("placeholder", "get_attr"):
                continue
            seen.add(node)
            why = check_region_node(node, self.dependent)
            if why is not None:
                at = "" if node is start else f" (through {node.name!r})"
                reason = f"{start.name!r} is not position-wise{at}: {why}"
                break
            for arg in node.all_input_nodes:
                need = self._need(node, arg)
                if need == "whole":
                    reason = f"{start.name!r} reads the residual-stream value {arg.name!r} whole at {node.name!r}"
                    break
                if need == "prove":
                    todo.append(arg)
        self._reasons[start] = reason
        return reason
