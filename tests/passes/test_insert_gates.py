"""insert_gates on the hand-built graph: one fold gate per layer (two with gate="sublayer", one more for the
head), keyword arguments only, annotated; the plan returned names them, the plan given is unchanged."""
import pytest
import torch

import pass_graphs as G
from specfold_compile.ops import fold_ops
from specfold_compile.passes import insert_gates
from specfold_compile.passes.insert_gates import TAU_NODE

GATE_ARGUMENTS = {"h", "parents", "tau", "gate_index", "pack", "impl"}


@pytest.mark.parametrize("options, gates", [({}, 1), ({"gate": "sublayer"}, 2), ({"fold_head": True}, 2)],
                         ids=["layer", "sublayer", "head"])
def test_adds_gates_and_one_tau(options, gates):
    gm, plan, settings, example = G.prepared("insert_gates", **options)
    dense, before = gm(*example), G.count(gm)
    gm, new = insert_gates(gm, plan, settings)
    assert G.diff(before, G.count(gm)) == {fold_ops.FOLD_GATE: gates, torch.full: 1}
    layer = new.layers[0]
    all_gates = layer.gates + (new.head.gates if new.head is not None else ())
    assert len(all_gates) == gates and plan.layers[0].gates == ()  # the plan given is not changed
    states = [layer.h_in] + ([layer.h_mid] if options.get("gate") == "sublayer" else []) + \
        ([new.head.h_in] if new.head is not None else [])
    for index, (gate, state) in enumerate(zip(all_gates, states)):
        assert gate.args == () and set(gate.kwargs) == GATE_ARGUMENTS
        assert gate.kwargs["h"] is state and gate.kwargs["parents"] is plan.parents
        assert gate.kwargs["tau"] is new.tau and new.tau.name == TAU_NODE
        assert (gate.kwargs["gate_index"], gate.kwargs["pack"], gate.kwargs["impl"]) == (index, True, "torch")
        assert gate.meta["specfold"] == {"region": "head" if state is states[-1] and new.head else "layer 0",
                                         "role": "gate"}
    assert layer.rewritten == (f"{1 + (options.get('gate') == 'sublayer')} gate(s)",)
    out, masks = G.run(gm, example)
    assert torch.equal(out, dense) and len(masks) == gates  # gates computed, their results unused yet


def test_graph_flags():
    gm, plan, settings, example = G.prepared("insert_gates", gate_flags="graph")
    before = G.count(gm)
    gm, new = insert_gates(gm, plan, settings)
    assert G.diff(before, G.count(gm)) == {fold_ops.FOLD_GATE: 1, fold_ops.fold_flags_graph: 1, torch.full: 1}
    (gate,) = new.layers[0].gates
    flags = gate.kwargs["flags"]
    assert flags.target is fold_ops.fold_flags_graph and flags.meta["specfold"]["role"] == "gate_flags"
    assert flags.kwargs == {"h": plan.marker, "parents": plan.parents, "tau": new.tau}


def test_nothing_to_fold_changes_nothing():
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    from specfold_compile.passes import find_regions

    plan = find_regions(gm)
    code = gm.code
    out_gm, out_plan = insert_gates(gm, plan, G.settings())
    assert out_gm.code == code and out_plan is plan
