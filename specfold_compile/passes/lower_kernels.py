"""Pass 5: choose the implementation of every fold op and make the packed linears count-aware.

``kernels="torch"`` keeps the readable reference implementations; ``"triton"`` selects the generated
Triton kernels (no host synchronisation); ``"auto"`` picks Triton when the graph runs on CUDA and
Triton is importable. The linears of packed regions become ``specfold::packed_linear``, whose work
shrinks with the number of computed rows without the host reading that number; so does the packed
MLP's activation ``silu(gate) * up`` (``specfold::packed_silu_mul``, switch ``count_aware_swiglu``),
the widest elementwise work of a layer.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from ..ops import fold_ops
from .analyze import Analysis, _shape
from .op_args import bound_arguments


def resolve_impl(kernels: str, device_type: str) -> str:
    if kernels in fold_ops.IMPLS:
        return kernels
    from .. import kernels as k

    return "triton" if device_type == "cuda" and k.triton_available() else "torch"


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


def _swiglu_sites(packed: dict[Node, dict[str, Node]]) -> list[tuple[Node, Node, Node, Node, dict[str, Node]]]:
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
                            w_gate, w_up = _shape(lin.args[1]), _shape(up.args[1])
                            ok = w_gate is not None and w_up is not None and w_gate[0] == w_up[0]
                    else:  # the halves of one fused linear, gate first
                        g, u = _split_half(gate), _split_half(up)
                        ok = g is not None and u is not None and g[0] is u[0] is lin and (g[1], u[1]) == (0, 1)
                    if ok:
                        sites.append((mul, silu, gate, up, plan))
    return sites


def lower_kernels(gm: GraphModule, settings: Any) -> GraphModule:
    analysis: Analysis = gm.meta["specfold"]
    if not analysis.foldable:
        return gm
    graph = gm.graph
    marker_value = analysis.marker.meta["example_value"]
    impl = resolve_impl(settings.kernels, marker_value.device.type)
    if impl == "triton":  # refused here, at compile time, rather than at the first call
        from ..kernels import refuse_broken_bf16

        refuse_broken_bf16(marker_value.dtype, "options['kernels']='triton'")
    regions = list(analysis.layers) + ([analysis.head] if analysis.head is not None else [])
    for layer in regions:
        for gate in layer.gates:
            gate.args = (*gate.args[:5], impl, *gate.args[6:])
        if getattr(layer, "attention", None) is not None and layer.attention.target is fold_ops.FOLDED_ATTENTION:
            layer.attention.args = (*layer.attention.args[:8], impl, *layer.attention.args[9:])
        lowered: dict[Node, dict[str, Node]] = {}
        for lin, plan in layer.packed_linears:
            x, weight = lin.args[0], lin.args[1]
            bias = lin.args[2] if len(lin.args) > 2 else lin.kwargs.get("bias")
            with graph.inserting_before(lin):
                packed = graph.call_function(fold_ops.PACKED_LINEAR, (x, weight, bias, plan["count"],
                                                                       settings.dense_fraction, impl,
                                                                       settings.min_spill_us),
                                             settings.tuning.packed_linear_args())
            packed.meta.update(lin.meta)
            lin.replace_all_uses_with(packed)
            graph.erase_node(lin)
            lowered[packed] = plan
        n_swiglu = 0
        if getattr(settings, "count_aware_swiglu", True):
            for mul, silu, gate, up, plan in _swiglu_sites(lowered):
                with graph.inserting_before(mul):
                    act = graph.call_function(fold_ops.PACKED_SILU_MUL, (gate, up, plan["count"], impl))
                act.meta.update(mul.meta)
                mul.replace_all_uses_with(act)
                graph.erase_node(mul)
                if not silu.users:
                    graph.erase_node(silu)
                n_swiglu += 1
        layer.rewritten.append(f"kernels={impl}, {len(layer.packed_linears)} packed linears"
                               + (f", {n_swiglu} packed SwiGLU" if n_swiglu else ""))
    graph.lint()
    gm.recompile()
    return gm
