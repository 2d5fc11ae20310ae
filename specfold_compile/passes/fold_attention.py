"""Attention correction: ``branch_attention(unpack(q_p), unpack(k_p), unpack(v_p), k_pre, v_pre)`` becomes
``folded_attention(q_p, k_p, v_p, k_pre, v_pre, slot, count)`` (and the cache's valid length, if
given): the prefix part of the attention is computed once per computed row and reused by the rows
folded onto it; every row adds its own branch's block keys and values through a merge of the two
attention states."""

from __future__ import annotations

from typing import Any

from torch.fx import GraphModule

from ..ops import fold_ops
from .op_args import schema_arguments
from .plan import LayerRegion, RegionPlan, rewritten
from .rewrite import annotate, finish, fold_impl


def fold_attention(gm: GraphModule, plan: RegionPlan, settings: Any) -> tuple[GraphModule, RegionPlan]:
    if not plan.foldable:
        return gm, plan
    graph = gm.graph
    impl = fold_impl(plan, settings)
    layers: list[LayerRegion] = []
    for layer in plan.layers:
        attn = layer.attention
        arguments = schema_arguments(attn)
        unpacks = [arguments[name] for name in ("q", "k", "v")]
        slot = layer.plans[0].slot if layer.plans else None
        if slot is None or not all(u.target is fold_ops.unpack_rows and u.kwargs.get("slot") is slot for u in unpacks):
            plan = plan.noted(f"{layer.label}: attention inputs are not packed; left dense")
            layers.append(layer)
            continue
        folded_arguments = dict(q_p=unpacks[0].kwargs["x_p"], k_p=unpacks[1].kwargs["x_p"],
                                v_p=unpacks[2].kwargs["x_p"], k_pre=arguments["k_pre"], v_pre=arguments["v_pre"],
                                slot=slot, count=layer.plans[0].count, scale=arguments["scale"], impl=impl)
        if arguments.get("prefix_len") is not None:  # a static cache's valid keys
            folded_arguments["prefix_len"] = arguments["prefix_len"]
        with graph.inserting_before(attn):
            folded = graph.call_function(fold_ops.FOLDED_ATTENTION, (),
                                         {**folded_arguments, **settings.tuning.folded_attention_args()})
        annotate(folded, layer.label, "folded_attention", source=attn)
        attn.replace_all_uses_with(folded)
        graph.erase_node(attn)
        for u in set(unpacks):
            if not u.users:
                graph.erase_node(u)
        layers.append(rewritten(layer, "folded attention", attention=folded))
    return finish(gm), plan.with_regions(layers + ([plan.head] if plan.head is not None else []))
