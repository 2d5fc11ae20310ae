"""fold_attention on the hand-built graph: the branch attention of packed q/k/v becomes one folded
attention on the packed rows, built with keyword arguments."""
import torch

import pass_graphs as G
from specfold_compile.ops import fold_ops
from specfold_compile.passes import fold_attention
from specfold_compile.passes.op_args import schema_arguments


def test_replaces_the_branch_attention():
    gm, plan, settings, example = G.prepared("fold_attention")
    unfolded, masks_before = G.run(gm, example)
    before = G.count(gm)
    inputs = schema_arguments(plan.layers[0].attention)
    packed = [inputs[name].kwargs["x_p"] for name in ("q", "k", "v")]  # what the unpacks read
    gm, new = fold_attention(gm, plan, settings)
    assert G.diff(before, G.count(gm)) == {G.ATTENTION: -1, fold_ops.FOLDED_ATTENTION: 1, fold_ops.unpack_rows: -3}
    layer, old = new.layers[0], plan.layers[0]
    assert old.attention.target is G.ATTENTION and layer.attention.target is fold_ops.FOLDED_ATTENTION
    folded = layer.attention
    assert folded.args == ()
    assert [folded.kwargs[k] for k in ("q_p", "k_p", "v_p")] == packed
    assert folded.kwargs["slot"] is layer.plans[0].slot and folded.kwargs["count"] is layer.plans[0].count
    assert folded.kwargs["impl"] == "torch" and folded.kwargs["scale"] == G.D ** -0.5
    assert "prefix_len" not in folded.kwargs  # the whole cache is the prefix
    assert folded.meta["specfold"] == {"region": "layer 0", "role": "folded_attention"}
    assert layer.rewritten[-1] == "folded attention"
    out, masks = G.run(gm, example)
    assert all(torch.equal(a, b) for a, b in zip(masks, masks_before))
    assert torch.allclose(out, unfolded, atol=1e-5)  # the same attention, computed once per computed row


def test_unpacked_attention_is_left_dense():
    gm, plan, settings, example = G.prepared("pack_regions")  # gates, but no packing
    before = G.count(gm)
    gm, new = fold_attention(gm, plan, settings)
    assert G.count(gm) == before and new.layers == plan.layers
    assert new.notes == ("layer 0: attention inputs are not packed; left dense",)
