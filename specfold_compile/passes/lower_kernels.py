"""Pass 5: choose the implementation of every fold op and make the packed linears count-aware.

``kernels="torch"`` keeps the readable reference implementations; ``"triton"`` selects the generated
Triton kernels (no host synchronisation); ``"auto"`` picks Triton when the graph runs on CUDA and
Triton is importable. The linears of packed regions become ``specfold::packed_linear``, whose work
shrinks with the number of computed rows without the host reading that number.
"""

from __future__ import annotations

from typing import Any

from torch.fx import GraphModule

from .. import fold_ops
from .analyze import Analysis


def resolve_impl(kernels: str, device_type: str) -> str:
    if kernels in fold_ops.IMPLS:
        return kernels
    from .. import kernels as k

    return "triton" if device_type == "cuda" and k.triton_available() else "torch"


def lower_kernels(gm: GraphModule, settings: Any) -> GraphModule:
    analysis: Analysis = gm.meta["specfold"]
    if not analysis.foldable:
        return gm
    graph = gm.graph
    impl = resolve_impl(settings.kernels, analysis.marker.meta["example_value"].device.type)
    regions = list(analysis.layers) + ([analysis.head] if analysis.head is not None else [])
    for layer in regions:
        for gate in layer.gates:
            gate.args = (*gate.args[:5], impl, *gate.args[6:])
        if getattr(layer, "attention", None) is not None and layer.attention.target is fold_ops.FOLDED_ATTENTION:
            layer.attention.args = (*layer.attention.args[:8], impl)
        for lin, plan in layer.packed_linears:
            x, weight = lin.args[0], lin.args[1]
            bias = lin.args[2] if len(lin.args) > 2 else lin.kwargs.get("bias")
            with graph.inserting_before(lin):
                packed = graph.call_function(fold_ops.PACKED_LINEAR, (x, weight, bias, plan["count"],
                                                                       settings.dense_fraction, impl,
                                                                       settings.min_spill_us))
            packed.meta.update(lin.meta)
            lin.replace_all_uses_with(packed)
            graph.erase_node(lin)
        layer.rewritten.append(f"kernels={impl}, {len(layer.packed_linears)} packed linears")
    graph.lint()
    gm.recompile()
    return gm
