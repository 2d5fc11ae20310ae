"""An op's arguments by parameter name, matched to its signature or schema.

The analysis must know which dims an op touches wherever the caller put them: ``x.norm(2, 1)``,
``torch.norm(x, 2, 1)`` and ``torch.linalg.vector_norm(x, 2, dim=1)`` all reduce over dim 1, the
first argument after the tensor being the order. So every check reads ``dim`` (``dims``,
``normalized_shape``, ...) from the arguments bound here, never from a fixed position; an op whose
arguments cannot be bound to exactly one signature has unknown dims, which the caller treats as a
blocker.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch.fx import Node
from torch.fx.operator_schemas import normalize_function

# Tensor methods taking their dims as varargs (``x.flip(1, 2)``, ``x.permute(0, 1, 3, 2)``) where the
# function form takes one list.
VARARG_METHODS = frozenset({"flip", "permute"})


def _method_function(name: str) -> Callable | None:
    """The function whose signature a Tensor method ``name`` binds to (self as the first parameter):
    the method itself where it is written in Python (``Tensor.norm``, ``Tensor.split``), else the
    ``torch.<name>`` builtin with the same schemas."""
    method = getattr(torch.Tensor, name, None)
    if method is None:
        return None
    try:
        inspect.signature(method)
        return method
    except (TypeError, ValueError):  # a C method: no Python signature
        fn = getattr(torch, name, None)
        return fn if callable(fn) and not isinstance(fn, type) else None


def _value_type(value: Any) -> Any:
    """The type of an argument as ``normalize_function`` compares it with a schema's annotations."""
    if isinstance(value, Node):
        value = value.meta.get("example_value", value.meta.get("val"))
    if isinstance(value, torch.Tensor):
        return torch.Tensor
    if isinstance(value, torch.SymBool):
        return bool
    if isinstance(value, torch.SymInt):
        return int
    if isinstance(value, torch.SymFloat):
        return float
    if isinstance(value, (list, tuple)):
        kinds = {_value_type(v) for v in value}
        element = kinds.pop() if len(kinds) == 1 else object
        return list[element] if element is not object else type(value)
    return type(value)


def bound_arguments(node: Node) -> dict[str, Any] | None:
    """``{parameter name: argument}`` for a call node (defaults filled in), or None when its target has
    no known signature or the arguments do not match exactly one of its overloads."""
    if node.op == "call_method":
        fn = _method_function(node.target)
    elif node.op == "call_function":
        fn = node.target
    else:
        return None
    if fn is None:
        return None
    args, kwargs = tuple(node.args), dict(node.kwargs)
    if node.op == "call_method" and node.target in VARARG_METHODS and len(args) > 2:
        args = (args[0], list(args[1:]))
    try:
        try:
            pair = normalize_function(fn, args, kwargs, normalize_to_only_use_kwargs=True)
        except RuntimeError:  # several overloads bind these arguments: choose by their types
            pair = normalize_function(fn, args, kwargs, tuple(_value_type(a) for a in args),
                                      {k: _value_type(v) for k, v in kwargs.items()},
                                      normalize_to_only_use_kwargs=True)
    except (RuntimeError, TypeError, ValueError):
        return None
    return None if pair is None else dict(pair.kwargs)


def first_argument(bound: dict[str, Any]) -> Any:
    """The op's first parameter's value: the tensor it operates on (``input``, ``self``, ``tensors``)."""
    return next(iter(bound.values()), None)


def schema_arguments(node: Node) -> dict[str, Any]:
    """``{parameter name: argument}`` of a call to an ``OpOverload`` (a custom op such as
    ``specfold::branch_attention``), from its schema; parameters left to their defaults are absent."""
    names = [a.name for a in node.target._schema.arguments]
    return {**dict(zip(names, node.args)), **node.kwargs}
