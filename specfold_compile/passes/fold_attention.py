"""Pass 4: attention correction. ``branch_attention(unpack(q_p), unpack(k_p), unpack(v_p), K_pre, V_pre)``
becomes ``folded_attention(q_p, k_p, v_p, K_pre, V_pre, slot, count)`` (and the cache's valid length,
if given): the prefix part of the attention is computed once per computed row and reused by the rows
folded onto it; every row adds its own branch's block keys and values through a merge of the two
attention states."""

from __future__ import annotations

from typing import Any

from torch.fx import GraphModule

from ..ops import fold_ops
from .analyze import Analysis


def fold_attention(gm: GraphModule, settings: Any) -> GraphModule:
    analysis: Analysis = gm.meta["specfold"]
    if not analysis.foldable:
        return gm
    graph = gm.graph
    for layer in analysis.layers:
        attn = layer.attention
        q, k, v, k_pre, v_pre, scale, *prefix_len = attn.args  # prefix_len: a static cache's valid keys
        unpacks = (q, k, v)
        plan = layer.plans[0]
        if not all(u.target is fold_ops.unpack_rows and u.args[1] is plan["slot"] for u in unpacks):
            analysis.notes.append(f"layer {layer.index}: attention inputs are not packed; left dense")
            continue
        with graph.inserting_before(attn):
            folded = graph.call_function(fold_ops.FOLDED_ATTENTION,
                                         (q.args[0], k.args[0], v.args[0], k_pre, v_pre, plan["slot"],
                                          plan["count"], scale, "torch", *prefix_len),
                                         settings.tuning.folded_attention_args())
        folded.meta.update({k_: attn.meta[k_] for k_ in ("nn_module_stack", "stack_trace") if k_ in attn.meta})
        attn.replace_all_uses_with(folded)
        graph.erase_node(attn)
        for u in unpacks:
            if not u.users:
                graph.erase_node(u)
        layer.attention = folded
        layer.rewritten.append("folded attention")
    graph.lint()
    gm.recompile()
    return gm
