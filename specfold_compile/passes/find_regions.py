"""The analysis: find the branch marker, follow the residual stream, split it into decoder layers.

``find_regions(gm) -> RegionPlan`` names, for every layer, the residual input ``h_in``, the attention
node, the two residual adds (``h_mid = h_in + attn``, ``h_out = h_mid + mlp``) and the two
position-wise regions that folding packs: the pre-attention region (``h_in`` -> q, k, v) and the MLP
region (``h_mid`` -> the MLP output). Every op in them is checked (``position_wise``: its dims read
from its arguments bound to its signature), and so is every value that enters a region from outside;
anything that is not position-wise, an outside value that is not position-wise back to the residual
stream or the graph inputs, or a region value used outside its region, becomes a typed ``Blocker``.
The graph is not changed.
"""

from __future__ import annotations

import operator
from collections import deque
from typing import Any

from torch.fx import GraphModule, Node

from . import ops_table as T
from .op_args import bound_arguments, schema_arguments
from .plan import Blocker, HeadRegion, LayerRegion, RegionPlan
from .position_wise import OutsideValues, check_region_node
from .position_wise import shape_of as _shape


def _descendants(start: Node) -> set[Node]:
    seen: set[Node] = set()
    todo = deque(start.users)
    while todo:
        n = todo.popleft()
        if n not in seen:
            seen.add(n)
            todo.extend(n.users)
    return seen


def _ancestors(starts: list[Node], stop: set[Node] | None = None) -> set[Node]:
    seen: set[Node] = set()
    todo = deque(starts)
    while todo:
        n = todo.popleft()
        if n in seen:
            continue
        seen.add(n)
        if stop and n in stop:
            continue
        todo.extend(n.all_input_nodes)
    return seen


def _layer_name(node: Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "?"
    path = list(stack.values())[-1][0]
    return str(path).replace("L['self'].", "").replace("L['self']", "")


def _is_residual_add(node: Node, h: Node) -> Node | None:
    """If ``node`` is ``h + x`` (either order), return x."""
    if node.op != "call_function" or node.target not in T.RESIDUAL_ADDS or len(node.args) < 2:
        return None
    a, b = node.args[0], node.args[1]
    if node.kwargs.get("alpha", 1) != 1:
        return None
    if a is h and isinstance(b, Node):
        return b
    if b is h and isinstance(a, Node):
        return a
    return None


def find_regions(gm: GraphModule, settings: Any = None) -> RegionPlan:
    """The regions of ``gm`` (unchanged); with ``settings.fold_head`` the head region too."""
    markers = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is T.BRANCH_MARKER]
    if not markers:
        return RegionPlan(skip_reason="no specfold::branches marker: not a multi-branch verification graph")
    if len(markers) > 1:
        return RegionPlan(blockers=(Blocker("multiple_markers", f"{len(markers)} branch markers in one graph"),))
    marker = markers[0]
    plan = RegionPlan(marker=marker, parents=marker.args[1])
    shape = _shape(marker)
    if shape is not None and type(shape[0]) is int and shape[0] == 1:
        # torch.compile specialises N = 1 (the first call of every block): row 0 is always computed, so
        # gates and packing would only add launches to the plain graph.
        return RegionPlan(marker=plan.marker, parents=plan.parents,
                          skip_reason="one branch (N = 1): every row is the main row, nothing to fold")
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    outside = OutsideValues(marker, _descendants(marker))
    layers: list[LayerRegion] = []
    blockers: list[Blocker] = []

    h = marker
    while True:
        desc = _descendants(h)
        attentions = sorted((n for n in desc if n.op == "call_function" and n.target is T.BRANCH_ATTENTION),
                            key=order.__getitem__)
        if not attentions:
            break
        region = _layer(h, attentions[0], len(layers), blockers, order, outside)
        if region is None:
            return RegionPlan(plan.marker, plan.parents, tuple(layers), blockers=tuple(blockers))
        layers.append(region)
        outside.stream |= {region.h_mid, region.h_out}
        h = region.h_out
    plan = RegionPlan(plan.marker, plan.parents, tuple(layers), blockers=tuple(blockers))
    if not layers:
        return RegionPlan(plan.marker, plan.parents, blockers=(
            Blocker("no_layers", "no specfold::branch_attention after the branch marker"),))
    if getattr(settings, "fold_head", False):
        head = _head_region(_after_row_shift(h), order, outside)
        if head is None:
            return plan.noted("fold_head: no position-wise op reads the last layer's output (logits of "
                              "selected positions only, logit_positions?); head left dense")
        return RegionPlan(plan.marker, plan.parents, plan.layers, head, plan.blockers)
    return plan


def _after_row_shift(h: Node) -> Node:
    """The Fast-dLLM logit shift applied to the last layer's output (``cat((h[..., -1:, :], h[..., :-1, :]),
    dim=-2)``, as ``BlockDiffusionLM.verify`` does before the head): its output, whose rows the head
    region then starts from (the shift moves whole rows, so a gate there is SPEC's head gate applied one
    position earlier, and the logits are the same). Any other use of ``h``: ``h`` itself."""
    users = list(h.users)
    if not users or not all(u.op == "call_function" and u.target is operator.getitem for u in users):
        return h
    cats = {c for u in users for c in u.users}
    if len(cats) != 1:
        return h
    cat = cats.pop()
    bound = bound_arguments(cat) if cat.target in T.CAT_FUNCTIONS else None
    if bound is None:
        return h
    dim, pieces = bound.get("dim"), bound.get("tensors", ())
    shape, h_shape = _shape(cat), _shape(h)
    rank = len(h_shape) if h_shape is not None else 0
    if shape is None or shape != h_shape or dim not in (-2, rank - 2) \
            or not all(isinstance(a, Node) and a in users for a in pieces):
        return h
    return cat


def _head_region(h: Node, order: dict[Node, int], outside: OutsideValues) -> HeadRegion | None:
    """The largest set of position-wise ops fed (transitively) only by the last layer's output ``h``
    and graph constants: the final norm and the LM head, up to the first op that mixes positions (the
    Fast-dLLM logit shift) or the graph output."""
    members: set[Node] = set()
    desc = _descendants(h)
    outside.stream.add(h)
    for node in sorted(desc, key=order.__getitem__):
        if node.op != "call_function" and node.op != "call_method":
            continue
        inputs_ok = all(a is h or a in members or (a not in desc and outside.operand_reason(node, a) is None)
                        for a in node.all_input_nodes)
        if inputs_ok and any(a is h or a in members for a in node.all_input_nodes) \
                and check_region_node(node, members | {h}) is None and _shape(node) is not None:
            members.add(node)
    outputs = [n for n in members if any(u not in members for u in n.users)]
    if not members or any(_shape(o) is None or len(_shape(o)) < 3 for o in outputs):
        return None
    return HeadRegion(h, tuple(sorted(members, key=order.__getitem__)), tuple(sorted(outputs, key=order.__getitem__)))


def _layer(h: Node, attn: Node, index: int, blockers: list[Blocker], order: dict[Node, int],
           outside: OutsideValues) -> LayerRegion | None:
    """Layer ``index`` from its input ``h`` and its attention; its blockers are added to ``blockers``."""
    name = _layer_name(attn)
    attn_desc = _descendants(attn)
    mids = [(u, x) for u in h.users if (x := _is_residual_add(u, h)) is not None and x in attn_desc]
    if len(mids) != 1:
        blockers.append(Blocker("no_residual", f"expected one residual add of the attention output "
                                         f"to the layer input, found {len(mids)}", index, attn.name))
        return None
    h_mid = mids[0][0]
    mid_desc = _descendants(h_mid)
    outs = []
    for u in h_mid.users:
        x = _is_residual_add(u, h_mid)
        if x is None or x not in mid_desc:
            continue
        between = _ancestors([x], stop={h_mid}) & mid_desc
        if not any(n.target is T.BRANCH_ATTENTION for n in between):
            outs.append((u, x))
    if len(outs) != 1:
        blockers.append(Blocker("no_residual", f"expected one residual add of the MLP output, found "
                                         f"{len(outs)}", index, h_mid.name))
        return None
    h_out, mlp_out = outs[0]

    h_desc = _descendants(h)
    qkv = [schema_arguments(attn)[name] for name in ("q", "k", "v")]
    pre = (_ancestors(qkv, stop={h}) & h_desc)
    mlp = (_ancestors([mlp_out], stop={h_mid}) & mid_desc)
    region = LayerRegion(index, name, h, attn, h_mid, h_out, mlp_out,
                         tuple(sorted(pre, key=order.__getitem__)), tuple(sorted(mlp, key=order.__getitem__)))
    outside.stream |= {h, h_mid}
    _check_region(region.pre_attention, set(pre), h, allowed_users={attn}, index=index, blockers=blockers,
                  what="pre-attention", outside=outside)
    _check_region(region.mlp, set(mlp), h_mid, allowed_users={h_out}, index=index, blockers=blockers,
                  what="MLP", outside=outside)
    for rank_node in (h, h_mid):
        shape = _shape(rank_node)
        if shape is None or len(shape) < 3:
            blockers.append(Blocker("layout", "residual stream is not [N, B, C]", index, rank_node.name))
        elif not isinstance(shape[1], int):
            # Packed rows are addressed as n * B + b; B must be a constant of the graph.
            blockers.append(Blocker("layout", f"block length {shape[1]} is not static", index,
                                             rank_node.name))
    return region


def _check_region(nodes: tuple[Node, ...], members: set[Node], entry: Node, allowed_users: set[Node], index: int,
                  blockers: list[Blocker], what: str, outside: OutsideValues) -> None:
    for node in nodes:
        reason = check_region_node(node, members | {entry})
        if reason:
            blockers.append(Blocker("unsupported_op", f"{what} region: {reason}", index, node.name))
        for value in node.all_input_nodes:
            if value not in members and value is not entry:
                reason = outside.operand_reason(node, value)
                if reason:
                    blockers.append(Blocker("outside_value", f"{what} region: {reason}", index, node.name))
        for user in node.users:
            if user not in members and user not in allowed_users:
                blockers.append(Blocker(
                    "escaping_value", f"{what} value is also used by {user.name!r} outside the region", index,
                    node.name))
