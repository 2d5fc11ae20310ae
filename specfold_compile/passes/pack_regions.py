"""Run each region's position-wise ops on the computed rows only.

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

from torch.fx import Graph, GraphModule, Node
from torch.fx.node import map_arg

from ..ops import fold_ops
from . import ops_table as T
from .op_args import schema_arguments
from .plan import HeadRegion, LayerRegion, RegionPlan, RowPlan, rewritten
from .position_wise import shape_of, view_shape_args
from .rewrite import annotate, finish


def _row_plan(graph: Graph, gate: Node, region: str) -> RowPlan:
    """The gate's outputs rows, count and slot as graph values, right after the gate, and R = len(rows)."""
    values: dict[str, Node] = {}
    last = gate
    for name, index in (("rows", 2), ("count", 3), ("slot", 4)):  # fold_gate's outputs, in schema order
        with graph.inserting_after(last):
            last = values[name] = annotate(graph.call_function(operator.getitem, (gate, index)), region, name)
    with graph.inserting_after(last):
        values["n_rows"] = annotate(graph.call_method("size", (values["rows"], 0)), region, "n_rows")
    return RowPlan(**values)


class _Packer:
    """Copies regions into their packed form, making each plan's (branch, position) of the packed rows
    once, when an outside tensor needs them."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.coordinates: dict[int, tuple[Node, Node]] = {}

    def row_coordinates(self, plan: RowPlan, block: int, region: str) -> tuple[Node, Node]:
        if id(plan) not in self.coordinates:
            graph = self.graph
            with graph.inserting_after(plan.n_rows):
                branch = annotate(graph.call_function(operator.floordiv, (plan.rows, block)), region, "row_branch")
            with graph.inserting_after(branch):
                pos = annotate(graph.call_function(operator.mod, (plan.rows, block)), region, "row_position")
            self.coordinates[id(plan)] = (branch, pos)
        return self.coordinates[id(plan)]

    def copy(self, nodes: tuple[Node, ...], entry: Node, plan: RowPlan, region: str,
             packed_linears: list[tuple[Node, RowPlan]]) -> dict[Node, Node]:
        """Packed copies of ``nodes`` (inserted at the graph's insertion point): {original: copy}."""
        graph = self.graph
        block = shape_of(entry)[1]
        pack = graph.call_function(fold_ops.pack_rows, (), dict(x=entry, rows=plan.rows))
        env: dict[Node, Node] = {entry: annotate(pack, region, "pack")}
        outside: dict[tuple, Node] = {}

        def pack_outside(arg: Node, out_rank: int) -> Node:
            key = (arg, out_rank)
            if key not in outside:
                row_branch, row_pos = self.row_coordinates(plan, block, region)
                outside[key] = annotate(graph.call_function(fold_ops.pack_external, (), dict(
                    t=arg, out_rank=out_rank, row_branch=row_branch, row_pos=row_pos)), region, "pack_outside")
            return outside[key]

        for node in nodes:
            args = map_arg(node.args, lambda a: env.get(a, a))
            kwargs = map_arg(node.kwargs, lambda a: env.get(a, a))
            out_shape = shape_of(node)
            broadcasting = (node.target in T.ELEMENTWISE_FUNCTIONS or node.target in T.ELEMENTWISE_METHODS
                            or node.target in T.CAT_FUNCTIONS)
            if broadcasting and out_shape is not None:
                def swap(a: Any) -> Any:
                    if isinstance(a, Node) and a not in env and a is not entry:
                        shape = shape_of(a)
                        if shape is not None and _depends_on_rows(shape, len(out_shape)):
                            return pack_outside(a, len(out_shape))
                    return a
                args = map_arg(args, swap)
                kwargs = map_arg(kwargs, swap)
            if node.target in T.VIEW_METHODS or node.target in T.VIEW_FUNCTIONS:
                shape_args = view_shape_args(node)
                new_shape = [plan.n_rows, 1] + [env.get(a, a) if isinstance(a, Node) else a for a in shape_args[2:]]
                args = (args[0], *new_shape) if node.op == "call_method" else (args[0], tuple(new_shape))
                kwargs = {k: v for k, v in kwargs.items() if k != "shape"}
            new = graph.create_node(node.op, node.target, args, kwargs, name=f"{node.name}_packed")
            annotate(new, region, "packed_op", source=node)
            if node.target in T.LINEAR_FUNCTIONS:
                packed_linears.append((new, plan))
            env[node] = new
        return env

    def unpack(self, packed: Node, plan: RowPlan, region: str) -> Node:
        node = self.graph.call_function(fold_ops.unpack_rows, (), dict(x_p=packed, slot=plan.slot))
        return annotate(node, region, "unpack")


def _depends_on_rows(shape: tuple, out_rank: int) -> bool:
    """Does an outside tensor of this shape, broadcast against rank out_rank, vary along dims 0/1?"""
    offset = out_rank - len(shape)
    return any(0 <= d + offset < 2 and not (isinstance(s, int) and s == 1) for d, s in enumerate(shape))


def _erase_unused(graph: Graph, nodes: tuple[Node, ...]) -> None:
    for node in reversed(nodes):
        if not node.users:
            graph.erase_node(node)


def _pack_layer(packer: _Packer, layer: LayerRegion) -> LayerRegion:
    graph, region = packer.graph, layer.label
    attn_plan = _row_plan(graph, layer.gates[0], region)
    mlp_plan = _row_plan(graph, layer.gates[-1], region) if len(layer.gates) > 1 else attn_plan
    linears: list[tuple[Node, RowPlan]] = []

    attention = layer.attention
    inputs = schema_arguments(attention)
    with graph.inserting_before(attention):
        env = packer.copy(layer.pre_attention, layer.h_in, attn_plan, region, linears)
        unpacked = {}
        for name in ("q", "k", "v"):
            if inputs[name] not in unpacked:
                unpacked[inputs[name]] = packer.unpack(env[inputs[name]], attn_plan, region)
    for original, full in unpacked.items():
        attention.replace_input_with(original, full)

    with graph.inserting_before(layer.h_out):
        env = packer.copy(layer.mlp, layer.h_mid, mlp_plan, region, linears)
        mlp_full = packer.unpack(env[layer.mlp_out], mlp_plan, region)
    layer.h_out.replace_input_with(layer.mlp_out, mlp_full)

    _erase_unused(graph, layer.pre_attention + layer.mlp)
    return rewritten(layer, f"packed {len(layer.pre_attention)} pre-attention + {len(layer.mlp)} MLP ops",
                     plans=(attn_plan, mlp_plan), packed_linears=tuple(linears))


def _pack_head(packer: _Packer, head: HeadRegion) -> HeadRegion:
    graph, region = packer.graph, head.label
    plan = _row_plan(graph, head.gates[0], region)
    linears: list[tuple[Node, RowPlan]] = []
    members = set(head.nodes)
    readers = {u for o in head.outputs for u in o.users if u not in members}
    first_reader = next(n for n in graph.nodes if n in readers)
    with graph.inserting_before(first_reader):
        env = packer.copy(head.nodes, head.h_in, plan, region, linears)
        unpacked = {o: packer.unpack(env[o], plan, region) for o in head.outputs}
    for o, u in unpacked.items():
        for user in list(o.users):
            if user not in members and user is not u:
                user.replace_input_with(o, u)
    _erase_unused(graph, head.nodes)
    return rewritten(head, f"packed {len(head.nodes)} head ops", plans=(plan,), packed_linears=tuple(linears))


def pack_regions(gm: GraphModule, plan: RegionPlan, settings: Any) -> tuple[GraphModule, RegionPlan]:
    if not plan.foldable:
        return gm, plan
    packer = _Packer(gm.graph)
    regions = [_pack_layer(packer, layer) for layer in plan.layers]
    if plan.head is not None:
        regions.append(_pack_head(packer, plan.head))
    return finish(gm), plan.with_regions(regions)
