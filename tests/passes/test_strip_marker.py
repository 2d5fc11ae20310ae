"""strip_marker on the hand-built graph: only the branch marker goes; the graph computes what it did."""
import torch

import pass_graphs as G
from specfold_compile.passes import strip_marker


def test_removes_only_the_marker():
    gm, plan, settings, example = G.prepared("strip_marker")
    folded, _ = G.run(gm, example)
    before = G.count(gm)
    gm, new = strip_marker(gm, plan, settings)
    assert G.diff(before, G.count(gm)) == {G.BRANCHES: -1}
    assert "specfold.branches" not in gm.code and new is plan
    out, _ = G.run(gm, example)
    assert torch.equal(out, folded)


def test_graph_without_marker_is_unchanged():
    gm, example = G.build()
    gm, _ = strip_marker(gm, G.find_regions(gm), G.settings())  # strip once: no marker left
    code = gm.code
    gm, _ = strip_marker(gm, G.find_regions(gm), G.settings())
    assert gm.code == code
