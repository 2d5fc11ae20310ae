"""find_regions on the hand-built graph: the layer's regions, the head, blockers; the graph is not changed."""
import dataclasses
import operator

import pytest
import torch

import pass_graphs as G
from specfold_compile.passes import RegionPlan, find_regions


def test_finds_the_layer_and_leaves_the_graph_alone():
    gm, _ = G.build()
    code, before = gm.code, G.count(gm)
    plan = find_regions(gm, G.settings())
    assert gm.code == code and G.count(gm) == before
    assert isinstance(plan, RegionPlan) and plan.foldable and not plan.blockers and plan.head is None
    assert "specfold" not in gm.meta  # the plan is returned, not stored on the graph module
    (layer,) = plan.layers
    assert layer.h_in is plan.marker and plan.marker.target is G.BRANCHES
    assert plan.parents.op == "placeholder" and plan.parents.name == "parents"
    assert layer.attention.target is G.ATTENTION
    assert layer.h_mid.target is operator.add and layer.h_mid.args[0] is layer.h_in
    assert layer.h_out.target is operator.add and layer.h_out.args == (layer.h_mid, layer.mlp_out)
    assert (len(layer.pre_attention), len(layer.mlp)) == (G.PRE_ATTENTION_OPS, G.MLP_OPS)
    assert layer.gates == () and layer.plans == () and layer.rewritten == ()


def test_head_region_with_fold_head():
    gm, _ = G.build()
    plan = find_regions(gm, G.settings(fold_head=True))
    assert len(plan.head.nodes) == G.HEAD_OPS and plan.head.h_in is plan.layers[0].h_out
    (logits,) = plan.head.outputs
    assert logits.target is torch._C._nn.linear and list(logits.users)[0].op == "output"
    assert plan.regions == (plan.layers[0], plan.head)


def test_plan_is_frozen():
    gm, _ = G.build()
    plan = find_regions(gm, G.settings())
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.layers = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.layers[0].gates = ()


def test_a_reduction_over_positions_is_a_blocker():
    gm, _ = G.build()
    mean = next(n for n in gm.graph.nodes if n.op == "call_method" and n.target == "mean")  # the first norm's
    mean.update_arg(1, 1)  # mean over dim 1 (positions) instead of the channels
    plan = find_regions(gm, G.settings())
    assert not plan.foldable
    assert [(b.kind, b.layer, b.node) for b in plan.blockers] == [("unsupported_op", 0, mean.name)]
    assert "reduces over the branch/position dims" in str(plan.blockers[0])


def test_a_graph_without_marker_is_skipped():
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)
    plan = find_regions(gm)
    assert plan.skip_reason.startswith("no specfold::branches marker") and not plan.foldable
    assert plan.layers == () and plan.blockers == ()
