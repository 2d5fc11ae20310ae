"""Make the packed regions' work count-aware: their linears become ``specfold::packed_linear``, whose work
shrinks with the number of computed rows without the host reading that number; so does the packed
MLP's activation ``silu(gate) * up`` (``specfold::packed_silu_mul``, switch ``count_aware_swiglu``),
the widest elementwise work of a layer. Both run the implementation every fold op of the graph runs
(``rewrite.fold_impl``: ``kernels="torch"`` the readable references, ``"triton"`` the generated Triton
kernels, ``"auto"`` Triton when the graph runs on CUDA and Triton is importable).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from ..ops import fold_ops
from .op_args import bound_arguments
from .plan import RegionPlan, RowPlan, rewritten
from .position_wise import shape_of as _shape
from .rewrite import annotate, finish, fold_impl, resolve_impl

__all__ = ["lower_kernels", "resolve_impl"]  # resolve_impl: read by backend.dispatch

_SILU = (F.silu, torch.ops.aten.silu.default)
_MUL = (operator.mul, torch.mul, torch.ops.aten.mul.Tensor)


def _split_half(node: Node) -> tuple[Node, int] | None:
    """(the split tensor, index) for ``x.split(...)[index]`` / ``torch.split(x, ...)[index]`` along
    the last dim into two equal halves, else None."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return None
    split = node.args[0]
    if not isinstance(split, Node) or not ((split.op == "call_method" and split.target == "split")
                                           or split.target is torch.split):
        return None
    bound = bound_arguments(split)
    if bound is None:
        return None
    sizes = bound.get("split_size_or_sections", bound.get("split_size"))
    if not (isinstance(sizes, (list, tuple)) and len(sizes) == 2 and sizes[0] == sizes[1] and bound.get("dim") == -1):
        return None
    return split.args[0], node.args[1]


def _swiglu_sites(packed: dict[Node, RowPlan]) -> list[tuple[Node, Node, Node, Node, RowPlan]]:
    """(mul, silu, gate, up, plan) for every ``silu(gate) * up`` whose operands are the outputs of
    packed linears of one plan, as two linears of the same width or the two equal halves of one
    fused gate_up linear; nothing else is matched, so every match has gate.shape == up.shape."""
    sites = []
    for lin, plan in packed.items():
        halves = [u for u in lin.users if (u.op == "call_method" and u.target == "split") or u.target is torch.split]
        gates = [lin] + [g for sp in halves for g in sp.users]
        for gate in gates:
            for silu in [u for u in gate.users if u.target in _SILU]:
                for mul in [u for u in silu.users if u.target in _MUL and len(u.args) == 2 and not u.kwargs]:
                    up = mul.args[1] if mul.args[0] is silu else mul.args[0]
                    if not isinstance(up, Node) or up is silu:
                        continue
                    if gate is lin:  # two linears
                        ok = up in packed and packed[up] is plan and up is not lin
                        if ok:  # same width (out features), from the weights' traced shapes
                            w_gate, w_up = _shape(lin.kwargs["weight"]), _shape(up.kwargs["weight"])
                            ok = w_gate is not None and w_up is not None and w_gate[0] == w_up[0]
                    else:  # the halves of one fused linear, gate first
                        g, u = _split_half(gate), _split_half(up)
                        ok = g is not None and u is not None and g[0] is u[0] is lin and (g[1], u[1]) == (0, 1)
                    if ok:
                        sites.append((mul, silu, gate, up, plan))
    return sites


def _linear_arguments(lin: Node) -> tuple[Node, Node, Node | None]:
    """(input, weight, bias) of an ``F.linear`` node, wherever the caller put them."""
    bound = bound_arguments(lin)
    if bound is None:  # the builtin's positional form
        bound = {**dict(zip(("input", "weight", "bias"), lin.args)), **lin.kwargs}
    return bound["input"], bound["weight"], bound.get("bias")


def lower_kernels(gm: GraphModule, plan: RegionPlan, settings: Any) -> tuple[GraphModule, RegionPlan]:
    if not plan.foldable:
        return gm, plan
    graph = gm.graph
    impl = fold_impl(plan, settings)
    regions = []
    layers = len(plan.layers)
    for index, region in enumerate(plan.regions):  # the layers in order, then the LM head's region if any
        lowered: dict[Node, RowPlan] = {}
        fraction = fold_ops.layer_dense_fraction(settings.dense_fraction, index, layers)
        for lin, rows in region.packed_linears:
            x, weight, bias = _linear_arguments(lin)
            with graph.inserting_before(lin):
                packed = graph.call_function(fold_ops.PACKED_LINEAR, (), dict(
                    x=x, weight=weight, bias=bias, count=rows.count, dense_fraction=fraction,
                    impl=impl, min_spill_us=settings.min_spill_us, **settings.tuning.packed_linear_args()))
            packed.meta.update(lin.meta)
            annotate(packed, region.label, "packed_linear")
            lin.replace_all_uses_with(packed)
            graph.erase_node(lin)
            lowered[packed] = rows
        n_swiglu = 0
        if getattr(settings, "count_aware_swiglu", True):
            for mul, silu, gate, up, rows in _swiglu_sites(lowered):
                with graph.inserting_before(mul):
                    act = graph.call_function(fold_ops.PACKED_SILU_MUL, (), dict(gate=gate, up=up, count=rows.count,
                                                                                impl=impl))
                act.meta.update(mul.meta)
                annotate(act, region.label, "packed_silu_mul")
                mul.replace_all_uses_with(act)
                graph.erase_node(mul)
                if not silu.users:
                    graph.erase_node(silu)
                n_swiglu += 1
        head = f" (cuBLAS head {fraction:g} of the rows)" if impl == "triton" and lowered else ""
        regions.append(rewritten(region, f"kernels={impl}, {len(lowered)} packed linears{head}"
                                 + (f", {n_swiglu} packed SwiGLU" if n_swiglu else ""),
                                 packed_linears=tuple((p, rows) for p, rows in lowered.items())))
    return finish(gm), plan.with_regions(regions)
