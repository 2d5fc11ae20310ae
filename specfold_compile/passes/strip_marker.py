"""Last pass: drop the ``specfold::branches`` marker (an identity), so the graph runs as the model would."""

from __future__ import annotations

from typing import Any

from torch.fx import GraphModule

from . import ops_table as T
from .plan import RegionPlan
from .rewrite import finish


def strip_marker(gm: GraphModule, plan: RegionPlan, settings: Any = None) -> tuple[GraphModule, RegionPlan]:
    """The graph without its marker; the plan names no marker then (its uses read the marker's input)."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is T.BRANCH_MARKER:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    return finish(gm), plan
