"""lower_kernels on the hand-built graph: the packed linears become count-aware packed linears and the
packed SwiGLU one count-aware op, keyword arguments only, running the implementation asked for."""
import operator

import pytest
import torch
import torch.nn.functional as F

import pass_graphs as G
from specfold_compile.ops import fold_ops
from specfold_compile.passes import lower_kernels

FOLD_OPS = (fold_ops.FOLD_GATE, fold_ops.FOLDED_ATTENTION, fold_ops.PACKED_LINEAR, fold_ops.PACKED_SILU_MUL)


@pytest.mark.parametrize("swiglu", [True, False], ids=["swiglu", "no-swiglu"])
def test_packed_linears_and_swiglu(swiglu):
    gm, plan, settings, example = G.prepared("lower_kernels", count_aware_swiglu=swiglu)
    unlowered, _ = G.run(gm, example)
    before = G.count(gm)
    gm, new = lower_kernels(gm, plan, settings)
    expected = {torch._C._nn.linear: -4, fold_ops.PACKED_LINEAR: 4}
    if swiglu:
        expected |= {F.silu: -1, operator.mul: -1, fold_ops.PACKED_SILU_MUL: 1}
    assert G.diff(before, G.count(gm)) == expected
    layer = new.layers[0]
    (rows,) = set(layer.plans)
    assert [p.target for p, _ in layer.packed_linears] == [fold_ops.PACKED_LINEAR] * 4
    for packed, _ in layer.packed_linears:
        assert packed.args == () and packed.kwargs["count"] is rows.count
        assert (packed.kwargs["dense_fraction"], packed.kwargs["min_spill_us"], packed.kwargs["impl"]) == \
            (settings.dense_fraction, settings.min_spill_us, "torch")
        assert packed.meta["specfold"] == {"region": "layer 0", "role": "packed_linear"}
    if swiglu:
        (act,) = [n for n in gm.graph.nodes if n.target is fold_ops.PACKED_SILU_MUL]
        assert act.kwargs["gate"] is layer.packed_linears[1][0] and act.kwargs["up"] is layer.packed_linears[2][0]
    assert layer.rewritten[-1] == "kernels=torch, 4 packed linears" + (", 1 packed SwiGLU" if swiglu else "")
    out, _ = G.run(gm, example)
    assert torch.allclose(out, unlowered, atol=1e-5)


def test_triton_is_chosen_for_every_fold_op():
    gm, plan, _, _ = G.prepared("lower_kernels")
    settings = G.settings(kernels="triton")
    gm, _ = lower_kernels(gm, plan, settings)
    impls = {n.target: n.kwargs["impl"] for n in gm.graph.nodes if n.target in FOLD_OPS}
    # the gate and the folded attention were built before, with kernels="torch"; the new ops take triton
    assert impls == {fold_ops.FOLD_GATE: "torch", fold_ops.FOLDED_ATTENTION: "torch",
                     fold_ops.PACKED_LINEAR: "triton", fold_ops.PACKED_SILU_MUL: "triton"}
