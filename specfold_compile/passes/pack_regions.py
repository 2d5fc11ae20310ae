"""Pass 3: run each layer's position-wise regions on the computed rows only.

The pre-attention region (norm, q/k/v projections, RoPE, query scaling) and the MLP region are copied
into a packed form: their input ``[N, B, C]`` becomes ``[R, 1, C]`` (the computed rows, each as a branch
of one position); tensors from outside that vary with the position (RoPE tables) are gathered per
row; view/reshape arguments for the two leading dims become ``(R, 1)``. The region's outputs are
gathered back to ``[N, B, ...]`` through the origin map (``unpack_rows``), so a folded row reads its
origin's values. The result is exactly SPEC section 2 with dense attention; ``fold_attention`` then
makes the attention cheap.
"""

from __future__ import annotations

import operator
from typing import Any

from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from ..ops import fold_ops
from . import ops_table as T
from .analyze import Analysis, _shape, _view_shape_args

_KEEP_META = ("nn_module_stack", "stack_trace", "source_fn_stack")


def _plan(graph, gate: Node) -> dict[str, Node]:
    """The gate's outputs as graph values, right after the gate: rows, count, slot and R = len(rows)."""
    plan: dict[str, Node] = {}
    last = gate
    for name, index in (("rows", 2), ("count", 3), ("slot", 4)):
        with graph.inserting_after(last):
            last = plan[name] = graph.call_function(operator.getitem, (gate, index))
    with graph.inserting_after(last):
        plan["n_rows"] = graph.call_method("size", (plan["rows"], 0))
    return plan


def _row_coordinates(graph, plan: dict[str, Node], block: int) -> tuple[Node, Node]:
    """(branch, position) of every packed row, made once per plan when an outside tensor needs them."""
    if "row_branch" not in plan:
        with graph.inserting_after(plan["n_rows"]):
            plan["row_branch"] = graph.call_function(operator.floordiv, (plan["rows"], block))
        with graph.inserting_after(plan["row_branch"]):
            plan["row_pos"] = graph.call_function(operator.mod, (plan["rows"], block))
    return plan["row_branch"], plan["row_pos"]


def _depends_on_rows(shape: tuple, out_rank: int) -> bool:
    """Does an outside tensor of this shape, broadcast against rank out_rank, vary along dims 0/1?"""
    offset = out_rank - len(shape)
    return any(0 <= d + offset < 2 and not (isinstance(s, int) and s == 1) for d, s in enumerate(shape))


def _copy_packed(graph, nodes: list[Node], entry: Node, plan: dict[str, Node], block: int,
                 packed_linears: list[tuple[Node, dict[str, Node]]]) -> dict[Node, Node]:
    env: dict[Node, Node] = {entry: graph.call_function(fold_ops.pack_rows, (entry, plan["rows"]))}
    outside: dict[tuple, Node] = {}

    def pack_outside(arg: Node, out_rank: int) -> Node:
        key = (arg, out_rank)
        if key not in outside:
            outside[key] = graph.call_function(fold_ops.pack_external,
                                               (arg, out_rank, *_row_coordinates(graph, plan, block)))
        return outside[key]

    for node in nodes:
        args = map_arg(node.args, lambda a: env.get(a, a))
        kwargs = map_arg(node.kwargs, lambda a: env.get(a, a))
        out_shape = _shape(node)
        broadcasting = (node.target in T.ELEMENTWISE_FUNCTIONS or node.target in T.ELEMENTWISE_METHODS
                        or node.target in T.CAT_FUNCTIONS)
        if broadcasting and out_shape is not None:
            def swap(a: Any) -> Any:
                if isinstance(a, Node) and a not in env and a is not entry:
                    shape = _shape(a)
                    if shape is not None and _depends_on_rows(shape, len(out_shape)):
                        return pack_outside(a, len(out_shape))
                return a
            args = map_arg(args, swap)
            kwargs = map_arg(kwargs, swap)
        if node.target in T.VIEW_METHODS or node.target in T.VIEW_FUNCTIONS:
            shape_args = _view_shape_args(node)
            new_shape = [plan["n_rows"], 1] + [env.get(a, a) if isinstance(a, Node) else a for a in shape_args[2:]]
            args = (args[0], *new_shape) if node.op == "call_method" else (args[0], tuple(new_shape))
            kwargs = {k: v for k, v in kwargs.items() if k != "shape"}
        new = graph.create_node(node.op, node.target, args, kwargs, name=f"{node.name}_packed")
        new.meta.update({k: node.meta[k] for k in _KEEP_META if k in node.meta})
        if node.target in T.LINEAR_FUNCTIONS:
            packed_linears.append((new, plan))
        env[node] = new
    return env


def pack_regions(gm: GraphModule, settings: Any) -> GraphModule:
    analysis: Analysis = gm.meta["specfold"]
    if not analysis.foldable:
        return gm
    graph = gm.graph
    for layer in analysis.layers:
        block = _shape(layer.h_in)[1]
        attn_plan = _plan(graph, layer.gates[0])
        mlp_plan = _plan(graph, layer.gates[-1]) if len(layer.gates) > 1 else attn_plan
        layer.plans = [attn_plan, mlp_plan]

        with graph.inserting_before(layer.attention):
            env = _copy_packed(graph, layer.pre_attention, layer.h_in, attn_plan, block, layer.packed_linears)
            qkv = [graph.call_function(fold_ops.unpack_rows, (env[a], attn_plan["slot"]))
                   for a in layer.attention.args[:3]]
        layer.attention.args = (*qkv, *layer.attention.args[3:])

        with graph.inserting_before(layer.h_out):
            env = _copy_packed(graph, layer.mlp, layer.h_mid, mlp_plan, block, layer.packed_linears)
            mlp_full = graph.call_function(fold_ops.unpack_rows, (env[layer.mlp_out], mlp_plan["slot"]))
        layer.h_out.replace_input_with(layer.mlp_out, mlp_full)

        for node in reversed(layer.pre_attention + layer.mlp):
            if not node.users:
                graph.erase_node(node)
        layer.rewritten.append(f"packed {len(layer.pre_attention)} pre-attention + {len(layer.mlp)} MLP ops")
    head = analysis.head
    if head is not None:
        block = _shape(head.h_in)[1]
        plan = _plan(graph, head.gates[0])
        head.plans = [plan]
        members = set(head.nodes)
        readers = {u for o in head.outputs for u in o.users if u not in members}
        first_reader = next(n for n in graph.nodes if n in readers)
        with graph.inserting_before(first_reader):
            env = _copy_packed(graph, head.nodes, head.h_in, plan, block, head.packed_linears)
            unpacked = {o: graph.call_function(fold_ops.unpack_rows, (env[o], plan["slot"])) for o in head.outputs}
        for o, u in unpacked.items():
            for user in list(o.users):
                if user not in members and user is not u:
                    user.replace_input_with(o, u)
        for node in reversed(head.nodes):
            if not node.users:
                graph.erase_node(node)
        head.rewritten.append(f"packed {len(head.nodes)} head ops")
    graph.lint()
    gm.recompile()
    return gm
