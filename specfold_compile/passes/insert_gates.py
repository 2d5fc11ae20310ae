"""Pass 2: a ``specfold::fold_gate`` per layer (and per sublayer with ``gate="sublayer"``).

The gate reads the layer's residual input and ``parents`` and yields the fold mask, the origin map
and the packed row list with its count, all as device tensors. With ``gate_flags="graph"`` the fold
flags are plain tensor ops (``fold_ops.fold_flags_graph``) in front of the gate, which gets them as
its ``flags`` argument. ``tau`` is one 0-d float32 tensor made
once at the top of the graph and read by every gate (a graph constant: a new ``tau`` is a new compile,
and Inductor can lower the rewritten graph, which it could not with an extra buffer).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule

from ..ops import fold_ops
from .analyze import Analysis

TAU_NODE = "specfold_tau"


def insert_gates(gm: GraphModule, settings: Any) -> GraphModule:
    analysis: Analysis = gm.meta["specfold"]
    if not analysis.foldable:
        return gm
    graph = gm.graph
    device = analysis.marker.meta["example_value"].device
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    with graph.inserting_after(placeholders[-1]):
        analysis.tau = graph.create_node("call_function", torch.full, ((), settings.gate_tau),
                                         {"dtype": torch.float32, "device": device}, name=TAU_NODE)

    def add_gate(state, before, gate_index):
        with graph.inserting_before(before):
            flags = ()
            if settings.gate_flags == "graph":
                flags = (graph.call_function(fold_ops.fold_flags_graph, (state, analysis.parents, analysis.tau)),)
            gate = graph.call_function(fold_ops.FOLD_GATE, (state, analysis.parents, analysis.tau, gate_index,
                                                            settings.pack, "torch", *flags))
        gate.meta["specfold_gate_index"] = gate_index
        return gate

    gate_index = 0
    for layer in analysis.layers:
        entries = [(layer.h_in, layer.pre_attention[0] if layer.pre_attention else layer.attention)]
        if settings.gate == "sublayer":
            entries.append((layer.h_mid, layer.mlp[0] if layer.mlp else layer.h_out))
        for state, before in entries:
            layer.gates.append(add_gate(state, before, gate_index))
            gate_index += 1
        layer.rewritten.append(f"{len(entries)} gate(s)")
    if analysis.head is not None:
        analysis.head.gates.append(add_gate(analysis.head.h_in, analysis.head.nodes[0], gate_index))
        analysis.head.rewritten.append("1 gate")
    graph.lint()
    gm.recompile()
    return gm
