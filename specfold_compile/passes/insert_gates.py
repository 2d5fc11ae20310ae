"""A ``specfold::fold_gate`` per layer (and per sublayer with ``gate="sublayer"``), and per head region.

The gate reads the region's residual input and ``parents`` and yields the fold mask, the origin map
and the packed row list with its count, all as device tensors. With ``gate_flags="graph"`` the fold
flags are plain tensor ops (``fold_ops.fold_flags_graph``) in front of the gate, which gets them as
its ``flags`` argument. ``tau`` is one 0-d float32 tensor made once at the top of the graph and read
by every gate (a graph constant: a new ``tau`` is a new compile, and Inductor can lower the rewritten
graph, which it could not with an extra buffer).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule, Node

from ..ops import fold_ops
from .plan import RegionPlan, rewritten
from .rewrite import annotate, finish, fold_impl

TAU_NODE = "specfold_tau"


def insert_gates(gm: GraphModule, plan: RegionPlan, settings: Any) -> tuple[GraphModule, RegionPlan]:
    if not plan.foldable:
        return gm, plan
    graph = gm.graph
    impl = fold_impl(plan, settings)
    device = plan.marker.meta["example_value"].device
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    with graph.inserting_after(placeholders[-1]):
        tau = graph.create_node("call_function", torch.full, ((), settings.gate_tau),
                                {"dtype": torch.float32, "device": device}, name=TAU_NODE)
    annotate(tau, "graph", "tau")

    def add_gate(state: Node, before: Node, gate_index: int, region: str) -> Node:
        arguments = dict(h=state, parents=plan.parents, tau=tau, gate_index=gate_index, pack=settings.pack,
                         impl=impl)
        with graph.inserting_before(before):
            if settings.gate_flags == "graph":
                flags = graph.call_function(fold_ops.fold_flags_graph, (),
                                            dict(h=state, parents=plan.parents, tau=tau))
                arguments["flags"] = annotate(flags, region, "gate_flags")
            gate = graph.call_function(fold_ops.FOLD_GATE, (), arguments)
        return annotate(gate, region, "gate")

    regions = []
    gate_index = 0
    for layer in plan.layers:
        entries = [(layer.h_in, layer.pre_attention[0] if layer.pre_attention else layer.attention)]
        if settings.gate == "sublayer":
            entries.append((layer.h_mid, layer.mlp[0] if layer.mlp else layer.h_out))
        gates = []
        for state, before in entries:
            gates.append(add_gate(state, before, gate_index, layer.label))
            gate_index += 1
        regions.append(rewritten(layer, f"{len(entries)} gate(s)", gates=tuple(gates)))
    if plan.head is not None:
        gate = add_gate(plan.head.h_in, plan.head.nodes[0], gate_index, plan.head.label)
        regions.append(rewritten(plan.head, "1 gate", gates=(gate,)))
    return finish(gm), plan.with_regions(regions, tau=tau)
