"""Last pass: drop the ``specfold::branches`` marker (an identity), so the graph runs as the model would."""

from __future__ import annotations

from typing import Any

from torch.fx import GraphModule

from . import ops_table as T


def strip_marker(gm: GraphModule, settings: Any = None) -> GraphModule:
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is T.BRANCH_MARKER:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return gm
