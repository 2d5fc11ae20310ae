"""Pass 1 (analysis): find the branch marker, follow the residual stream, split it into decoder layers.

For every layer it records the residual input ``h_in``, the attention node, the two residual adds
(``h_mid = h_in + attn``, ``h_out = h_mid + mlp``) and the two position-wise regions that folding
packs: the pre-attention region (``h_in`` -> q, k, v) and the MLP region (``h_mid`` -> the MLP
output). Every op in them is checked against ``ops_table``; anything that is not position-wise, or a
region value used outside its region, becomes a typed ``Blocker``. The graph is not changed; the result
is stored in ``gm.meta["specfold"]``.
"""

from __future__ import annotations

import operator
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node

from . import ops_table as T


@dataclass
class Blocker:
    kind: str  # unsupported_op | escaping_value | layout | no_residual | no_layers | multiple_markers
    detail: str
    layer: int | None = None
    node: str | None = None

    def __str__(self) -> str:
        where = f"layer {self.layer}" if self.layer is not None else "graph"
        at = f" at node {self.node!r}" if self.node else ""
        return f"[{self.kind}] {where}{at}: {self.detail}"


@dataclass
class LayerRegion:
    index: int
    name: str
    h_in: Node
    attention: Node
    h_mid: Node
    h_out: Node
    mlp_out: Node
    pre_attention: list[Node]
    mlp: list[Node]
    # Filled by later passes.
    gates: list[Node] = field(default_factory=list)  # fold_gate nodes (1 per layer, 2 with gate="sublayer")
    plans: list[dict[str, Node]] = field(default_factory=list)  # rows/count/slot per gate
    packed_linears: list[tuple[Node, dict[str, Node]]] = field(default_factory=list)  # (linear, its plan)
    rewritten: list[str] = field(default_factory=list)


@dataclass
class HeadRegion:
    """The position-wise ops after the last layer (final norm, LM head), folded with ``fold_head``."""

    h_in: Node
    nodes: list[Node]
    outputs: list[Node]  # region values read outside it (the logits, before any logit shift)
    gates: list[Node] = field(default_factory=list)
    plans: list[dict[str, Node]] = field(default_factory=list)
    packed_linears: list[tuple[Node, dict[str, Node]]] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)


@dataclass
class Analysis:
    marker: Node | None = None
    parents: Node | None = None
    layers: list[LayerRegion] = field(default_factory=list)
    blockers: list[Blocker] = field(default_factory=list)
    skip_reason: str | None = None  # set when the graph is not a verification pass at all
    tau: Node | None = None
    head: HeadRegion | None = None
    notes: list[str] = field(default_factory=list)
    fold_plan: Any = None  # backend.dispatch.FoldPlan: which calls fold (set by the backend)

    @property
    def foldable(self) -> bool:
        return self.skip_reason is None and not self.blockers and bool(self.layers)


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


def _shape(node: Any) -> tuple | None:
    if not isinstance(node, Node):
        return None
    v = node.meta.get("example_value", node.meta.get("val"))
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _norm_dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _dims_arg(node: Node, pos: int, name: str) -> Any:
    if len(node.args) > pos:
        return node.args[pos]
    return node.kwargs.get(name)


def _op_name(node: Node) -> str:
    return node.target if node.op == "call_method" else getattr(node.target, "__name__", "")


def _check_norm(node: Node) -> str | None:
    src, shape = _shape(node.args[0]), _dims_arg(node, 1, "normalized_shape")
    if src is None or shape is None:
        return "normalisation of unknown shape"
    n_norm = len(shape) if isinstance(shape, (tuple, list)) else 1
    return None if len(src) - n_norm >= 2 else "normalisation over the branch/position dims"


def _check_cat(node: Node) -> str | None:
    shape = _shape(node)
    dim = _dims_arg(node, 1, "dim") or 0
    return None if shape and _norm_dim(dim, len(shape)) >= 2 else "cat along the branch/position dims"


# (methods, functions, checker(node, region)) for every kind of op a region may hold.
_CHECKS = (
    (T.ELEMENTWISE_METHODS, T.ELEMENTWISE_FUNCTIONS, lambda n, r: _check_elementwise(n, r)),
    (T.CAST_METHODS, set(), lambda n, r: None),
    (set(), T.LINEAR_FUNCTIONS, lambda n, r: None),
    (set(), T.NORM_FUNCTIONS, lambda n, r: _check_norm(n)),
    (T.REDUCTION_METHODS, T.REDUCTION_FUNCTIONS, lambda n, r: _check_reduction(n)),
    (T.VIEW_METHODS, T.VIEW_FUNCTIONS, lambda n, r: _check_view(n)),
    (T.DIM_METHODS, T.DIM_FUNCTIONS, lambda n, r: _check_dim_op(n)),
    (set(), T.CAT_FUNCTIONS, lambda n, r: _check_cat(n)),
    (set(), {operator.getitem}, lambda n, r: _check_getitem(n)),
    (T.SIZE_METHODS, T.SIZE_FUNCTIONS, lambda n, r: _check_size(n, r)),
    (T.SPLIT_METHODS, T.SPLIT_FUNCTIONS, lambda n, r: _check_split(n, _op_name(n))),
)


def check_region_node(node: Node, region: set[Node]) -> str | None:
    """None when ``node`` is position-wise with (branch, position) leading; else the reason."""
    if node.op not in ("call_method", "call_function"):
        return f"{node.op} node inside a region"
    for methods, functions, check in _CHECKS:
        if node.target in (methods if node.op == "call_method" else functions):
            return check(node, region)
    if node.op == "call_function" and (node.target is T.BRANCH_ATTENTION or node.target in T.KNOWN_MIXING):
        return f"{T.target_name(node)} mixes positions inside a position-wise region"
    return f"{T.target_name(node)} is not known to be position-wise"


def _check_elementwise(node: Node, region: set[Node]) -> str | None:
    out = _shape(node)
    if out is None:
        return "elementwise op of unknown shape"
    for arg in node.all_input_nodes:
        if arg in region and (_shape(arg) is None or len(_shape(arg)) != len(out)):
            return "elementwise op broadcasts a region value to a higher rank"
    return None


def _check_reduction(node: Node) -> str | None:
    shape = _shape(node.args[0])
    dim = _dims_arg(node, 1, "dim")
    if shape is None or dim is None:
        return "reduction over all dims (needs an explicit trailing dim)"
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    if any(_norm_dim(d, len(shape)) < 2 for d in dims):
        return "reduction over the branch/position dims"
    return None


def _view_shape_args(node: Node) -> list:
    args = list(node.args[1:])
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return list(args[0])
    if not args and "shape" in node.kwargs:
        return list(node.kwargs["shape"])
    return args


def _check_view(node: Node) -> str | None:
    src, out = _shape(node.args[0]), _shape(node)
    if src is None or out is None or len(src) < 2 or len(out) < 2:
        return "view of unknown shape"
    if str(src[0]) != str(out[0]) or str(src[1]) != str(out[1]):
        return "view/reshape changes the branch/position dims"
    if len(_view_shape_args(node)) != len(out):
        return "view/reshape with an unexpected shape argument"
    return None


def _check_dim_op(node: Node) -> str | None:
    """Dim-moving ops are fine when they leave dims 0 and 1 (branch, position) where they are."""
    src, out = _shape(node.args[0]), _shape(node)
    if src is None or out is None or len(src) < 2 or len(out) < 2:
        return "dim op of unknown shape"
    name = node.target if isinstance(node.target, str) else node.target.__name__
    args = list(node.args[1:])

    def arg(pos: int, key: str, default=None):
        return args[pos] if len(args) > pos else node.kwargs.get(key, default)

    def trailing(dims, rank: int) -> bool:
        dims = dims if isinstance(dims, (tuple, list)) else (dims,)
        return all(isinstance(d, int) and _norm_dim(d, rank) >= 2 for d in dims)

    if name == "transpose":
        ok = trailing((arg(0, "dim0"), arg(1, "dim1")), len(src))
    elif name == "permute":
        perm = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args or node.kwargs.get("dims", ())
        ok = [_norm_dim(d, len(src)) for d in perm][:2] == [0, 1]
    elif name == "unsqueeze":
        ok = trailing(arg(0, "dim"), len(out))
    elif name == "squeeze":
        ok = arg(0, "dim") is not None and trailing(arg(0, "dim"), len(src))
    elif name == "flatten":
        ok = trailing(arg(0, "start_dim", 0), len(src))
    elif name == "unflatten":
        ok = trailing(arg(0, "dim"), len(src))
    else:
        return f"{name} is not supported in a region"
    return None if ok else f"{name} moves the branch/position dims"


def _check_split(node: Node, name: str) -> str | None:
    src = _shape(node.args[0])
    dim_pos = 0 if name == "unbind" else 1  # unbind(dim) / chunk(chunks, dim) / split(size, dim)
    dim = node.args[1 + dim_pos] if len(node.args) > 1 + dim_pos else node.kwargs.get("dim", T.SPLIT_DEFAULT_DIM[name])
    if src is None or not isinstance(dim, int):
        return f"{name} of unknown shape"
    return None if _norm_dim(dim, len(src)) >= 2 else f"{name} splits the branch/position dims"


def _check_getitem(node: Node) -> str | None:
    if isinstance(node.args[0], Node) and isinstance(node.args[0].meta.get("example_value"), (tuple, list)):
        return None if isinstance(node.args[1], int) else "indexing a tuple with a non-int"
    src = _shape(node.args[0])
    if src is None:
        return None if not isinstance(node.args[0], Node) or _shape(node) is None else "indexing of unknown shape"
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


def find_regions(gm: GraphModule, settings: Any = None) -> GraphModule:
    """Annotate ``gm.meta["specfold"]`` with an ``Analysis``; the graph itself is unchanged."""
    analysis = Analysis()
    gm.meta["specfold"] = analysis
    markers = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is T.BRANCH_MARKER]
    if not markers:
        analysis.skip_reason = "no specfold::branches marker: not a multi-branch verification graph"
        return gm
    if len(markers) > 1:
        analysis.blockers.append(Blocker("multiple_markers", f"{len(markers)} branch markers in one graph"))
        return gm
    marker = markers[0]
    analysis.marker, analysis.parents = marker, marker.args[1]
    shape = _shape(marker)
    if shape is not None and type(shape[0]) is int and shape[0] == 1:
        # torch.compile specialises N = 1 (the first call of every block): row 0 is always computed, so
        # gates and packing would only add launches to the plain graph.
        analysis.skip_reason = "one branch (N = 1): every row is the main row, nothing to fold"
        return gm
    order = {n: i for i, n in enumerate(gm.graph.nodes)}

    h = marker
    while True:
        desc = _descendants(h)
        attentions = sorted((n for n in desc if n.op == "call_function" and n.target is T.BRANCH_ATTENTION),
                            key=order.__getitem__)
        if not attentions:
            break
        attn = attentions[0]
        layer = len(analysis.layers)
        region = _layer(h, attn, layer, analysis, order)
        if region is None:
            return gm
        analysis.layers.append(region)
        h = region.h_out
    if not analysis.layers:
        analysis.blockers.append(Blocker("no_layers", "no specfold::branch_attention after the branch marker"))
    elif getattr(settings, "fold_head", False):
        analysis.head = _head_region(_after_row_shift(h), order)
        if analysis.head is None:
            analysis.notes.append("fold_head: no position-wise op reads the last layer's output (logits of "
                                  "selected positions only, logit_positions?); head left dense")
    return gm


def _after_row_shift(h: Node) -> Node:
    """The Fast-dLLM logit shift applied to the last layer's output (``cat((h[..., :1, :], h[..., :-1, :]),
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
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    shape, h_shape = _shape(cat), _shape(h)
    rank = len(h_shape) if h_shape is not None else 0
    if cat.target not in T.CAT_FUNCTIONS or shape is None or shape != h_shape or dim not in (-2, rank - 2) \
            or not all(isinstance(a, Node) and a in users for a in cat.args[0]):
        return h
    return cat


def _head_region(h: Node, order: dict[Node, int]) -> HeadRegion | None:
    """The largest set of position-wise ops fed (transitively) only by the last layer's output ``h``
    and graph constants: the final norm and the LM head, up to the first op that mixes positions (the
    Fast-dLLM logit shift) or the graph output."""
    members: set[Node] = set()
    desc = _descendants(h)
    for node in sorted(desc, key=order.__getitem__):
        if node.op != "call_function" and node.op != "call_method":
            continue
        inputs_ok = all(a is h or a in members or a not in desc for a in node.all_input_nodes)
        if inputs_ok and any(a is h or a in members for a in node.all_input_nodes) \
                and check_region_node(node, members | {h}) is None and _shape(node) is not None:
            members.add(node)
    outputs = [n for n in members if any(u not in members for u in n.users)]
    if not members or any(_shape(o) is None or len(_shape(o)) < 3 for o in outputs):
        return None
    return HeadRegion(h, sorted(members, key=order.__getitem__), sorted(outputs, key=order.__getitem__))


def _layer(h: Node, attn: Node, index: int, analysis: Analysis, order: dict[Node, int]) -> LayerRegion | None:
    name = _layer_name(attn)
    attn_desc = _descendants(attn)
    mids = [(u, x) for u in h.users if (x := _is_residual_add(u, h)) is not None and x in attn_desc]
    if len(mids) != 1:
        analysis.blockers.append(Blocker("no_residual", f"expected one residual add of the attention output "
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
        analysis.blockers.append(Blocker("no_residual", f"expected one residual add of the MLP output, found "
                                         f"{len(outs)}", index, h_mid.name))
        return None
    h_out, mlp_out = outs[0]

    h_desc = _descendants(h)
    qkv = [a for a in attn.args[:3]]
    pre = (_ancestors(qkv, stop={h}) & h_desc)
    mlp = (_ancestors([mlp_out], stop={h_mid}) & mid_desc)
    region = LayerRegion(index, name, h, attn, h_mid, h_out, mlp_out,
                         sorted(pre, key=order.__getitem__), sorted(mlp, key=order.__getitem__))
    _check_region(region.pre_attention, set(pre), h, allowed_users={attn}, index=index, analysis=analysis,
                  what="pre-attention")
    _check_region(region.mlp, set(mlp), h_mid, allowed_users={h_out}, index=index, analysis=analysis,
                  what="MLP")
    for rank_node in (h, h_mid):
        shape = _shape(rank_node)
        if shape is None or len(shape) < 3:
            analysis.blockers.append(Blocker("layout", "residual stream is not [N, B, C]", index, rank_node.name))
        elif not isinstance(shape[1], int):
            # Packed rows are addressed as n * B + b; B must be a constant of the graph.
            analysis.blockers.append(Blocker("layout", f"block length {shape[1]} is not static", index,
                                             rank_node.name))
    return region


def _check_region(nodes: list[Node], members: set[Node], entry: Node, allowed_users: set[Node], index: int,
                  analysis: Analysis, what: str) -> None:
    for node in nodes:
        reason = check_region_node(node, members | {entry})
        if reason:
            analysis.blockers.append(Blocker("unsupported_op", f"{what} region: {reason}", index, node.name))
        for user in node.users:
            if user not in members and user not in allowed_users:
                analysis.blockers.append(Blocker(
                    "escaping_value", f"{what} value is also used by {user.name!r} outside the region", index,
                    node.name))
