"""pack_regions on the hand-built graph: both regions copied into their packed form one op for one, with
the packing around them; a folded row reads its origin's values."""
import operator

import torch

import pass_graphs as G
from specfold_compile.ops import fold_ops
from specfold_compile.passes import RowPlan, pack_regions
from specfold_compile.passes.op_args import schema_arguments


def test_packs_both_regions():
    gm, plan, settings, example = G.prepared("pack_regions")
    dense = gm(*example)
    before = G.count(gm)
    gm, new = pack_regions(gm, plan, settings)
    assert G.diff(before, G.count(gm)) == {
        fold_ops.pack_rows: 2,  # the entries of the pre-attention and MLP regions
        fold_ops.unpack_rows: 4,  # q, k, v and the MLP output
        fold_ops.pack_external: 1,  # the position table multiplied into q
        operator.getitem: 3,  # rows, count, slot of the gate (the region's getitems are copied one for one)
        "Tensor.size": 1,  # R = len(rows), for the packed view
        operator.floordiv: 1, operator.mod: 1,  # (branch, position) of the packed rows, for the table
    }
    layer, old = new.layers[0], plan.layers[0]
    assert old.plans == () and not any(n in gm.graph.nodes for n in old.pre_attention + old.mlp)
    (rows,) = set(layer.plans)  # one gate: both regions use its plan
    assert isinstance(rows, RowPlan) and [n.args for n in (rows.rows, rows.count, rows.slot)] == \
        [(layer.gates[0], 2), (layer.gates[0], 3), (layer.gates[0], 4)]
    assert len(layer.packed_linears) == 4 and all(p is rows for _, p in layer.packed_linears)
    inputs = schema_arguments(layer.attention)
    for name in ("q", "k", "v"):
        assert inputs[name].target is fold_ops.unpack_rows and inputs[name].kwargs["slot"] is rows.slot
    packs = [n for n in gm.graph.nodes if n.target is fold_ops.pack_rows]
    assert [n.kwargs["x"] for n in packs] == [layer.h_in, layer.h_mid] and all(not n.args for n in packs)
    roles = [a["role"] for _, a in G.inserted(gm) if a["region"] == "layer 0"]
    assert roles.count("packed_op") == G.PRE_ATTENTION_OPS + G.MLP_OPS and roles.count("unpack") == 4
    assert layer.rewritten[-1] == f"packed {G.PRE_ATTENTION_OPS} pre-attention + {G.MLP_OPS} MLP ops"
    out, masks = G.run(gm, example)
    assert masks[0].any(), "nothing folded at tau = 0.5"
    assert torch.allclose(out[0], dense[0], atol=1e-5)  # the main row is computed


def test_every_row_computed_at_tau_zero():
    gm, plan, settings, example = G.prepared("pack_regions", tau=0.0)
    dense = gm(*example)
    gm, _ = pack_regions(gm, plan, settings)
    out, masks = G.run(gm, example)
    assert not masks[0].any() and torch.allclose(out, dense, atol=1e-5)


def test_head_region():
    gm, plan, settings, example = G.prepared("pack_regions", fold_head=True)
    before = G.count(gm)
    gm, new = pack_regions(gm, plan, settings)
    d = G.diff(before, G.count(gm))
    assert d[fold_ops.pack_rows] == 3 and d[fold_ops.unpack_rows] == 5 and d[operator.getitem] == 6
    assert new.head.rewritten[-1] == f"packed {G.HEAD_OPS} head ops" and len(new.head.packed_linears) == 1
    assert list(gm.graph.nodes)[-1].args[0].target is fold_ops.unpack_rows  # the logits are unpacked
