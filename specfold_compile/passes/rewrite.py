"""What every rewrite shares: the fold ops' implementation, node annotations, finishing a graph.

Every node a rewrite inserts carries ``node.meta["specfold"] = {"region": ..., "role": ...}`` (region:
"layer 3", "head" or "graph"; role: "gate", "pack", "packed_op", "unpack", ...), which the dump files
and the ``specfold_graphs`` log show next to the code.
"""

from __future__ import annotations

from typing import Any

from torch.fx import GraphModule, Node

from ..ops import fold_ops
from .plan import RegionPlan

META_KEY = "specfold"
_KEEP_META = ("nn_module_stack", "stack_trace", "source_fn_stack")


def resolve_impl(kernels: str, device_type: str) -> str:
    """``settings.kernels`` ("auto", "torch", "triton") as the implementation the fold ops run."""
    if kernels in fold_ops.IMPLS:
        return kernels
    from .. import kernels as k

    return "triton" if device_type == "cuda" and k.triton_available() else "torch"


def fold_impl(plan: RegionPlan, settings: Any) -> str:
    """The implementation of the fold ops of ``plan``'s graph. Triton kernels the interpreter would run
    wrongly (bf16 under TRITON_INTERPRET=1) are refused here, at compile time, not at the first call."""
    marker_value = plan.marker.meta["example_value"]
    impl = resolve_impl(settings.kernels, marker_value.device.type)
    if impl == "triton":
        from ..kernels import refuse_broken_bf16

        refuse_broken_bf16(marker_value.dtype, "options['kernels']='triton'")
    return impl


def annotate(node: Node, region: str, role: str, source: Node | None = None) -> Node:
    """Mark ``node`` as inserted for ``region`` in ``role``; ``source``: the node it stands for, whose
    module path and stack trace it keeps (so profiles and dumps still point at the model's code)."""
    if source is not None:
        node.meta.update({k: source.meta[k] for k in _KEEP_META if k in source.meta})
    node.meta[META_KEY] = {"region": region, "role": role}
    return node


def annotation(node: Node) -> dict[str, str] | None:
    return node.meta.get(META_KEY)


def finish(gm: GraphModule) -> GraphModule:
    gm.graph.lint()
    gm.recompile()
    return gm
