"""SpecFold's attention over the packed rows (``packed_attention``: ``ops.folded_ragged_attention``, each
computed position's prefix walked once): the batched folded forward gives the logits of the ragged path
over every position's q, k, v with the same fold masks, and an engine replaying its forwards with it decodes
the tokens and fold masks of one without; the kernels run (counted); bad values are refused."""
import pytest
import torch

from specfold_compile import ops
from specfold_compile.serving.folded import verify_batch_folded
from specfold_compile.serving.graphs import BatchGraphs
from specfold_compile.testing import TINY_FAMILIES as FAMILIES, tiny_model

from test_capacity_gates import _serve
from test_folded_batch import _requests


@pytest.fixture
def packed_calls(monkeypatch):
    """How often the packed attention ran, and over how many packed rows in all."""
    seen = {"calls": 0, "rows": 0}
    op = ops.folded_ragged_attention

    def counted(q_p, *args):
        seen["calls"] += 1
        seen["rows"] += int(q_p.shape[0])
        return op(q_p, *args)
    monkeypatch.setattr(ops, "folded_ragged_attention", counted)
    return seen


@pytest.mark.parametrize("family, gate", [(FAMILIES[0], "layer"), (FAMILIES[1], "layer"), (FAMILIES[0], "sublayer")])
def test_the_packed_attention_gives_the_ragged_paths_logits(family, gate, packed_calls):
    """Fold masks forced from the ragged path over every position: the same logits to float32 rounding (the
    prefix states merged in another order), empty prefixes and ragged branch counts included; one packed
    attention a layer over the attention gate's computed rows (with ``gate="sublayer"`` the MLP's gate
    packs its own)."""
    model = tiny_model(family)
    gen = torch.Generator().manual_seed(11)
    with torch.inference_mode():
        pool, _, slots, rows, parents, positions = _requests(model, [0, 17, 40], [1, 7, 4], gen)
        base, masks = verify_batch_folded(model, pool, slots, rows, parents, positions, 0.2, gate=gate,
                                          attention="ragged")
        assert packed_calls["calls"] == 0
        packed, again = verify_batch_folded(model, pool, slots, rows, parents, positions, 0.2, fold_masks=masks,
                                            gate=gate, attention="ragged", packed_attention=True)
    assert any(m.any() for m in masks) and all(torch.equal(a, b) for a, b in zip(again, masks))
    assert packed_calls["calls"] == len(model.layers)
    attention_gates = range(0, len(masks[0]), 2 if gate == "sublayer" else 1)  # each layer's first gate
    assert packed_calls["rows"] == sum(int((~torch.cat([r[g] for r in masks])).sum()) for g in attention_gates)
    for a, b in zip(packed, base):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not ops.triton_runs(torch.device("cpu")) and not torch.cuda.is_available(),
                    reason="the gates' and attention's kernels need Triton (TRITON_INTERPRET=1 on the CPU)")
@pytest.mark.parametrize("family", FAMILIES)
def test_an_engine_with_the_packed_attention_decodes_alike(family, packed_calls):
    """Replayed (eagerly, the CPU's path) with and without it: the same tokens and fold masks, some
    positions folded, the packed attention run in every folded forward's layers (its packed rows padded
    to each graph's capacity), both families."""
    model = tiny_model(family)
    runs = []
    for packed_attention in (True, False):
        graphs = BatchGraphs(model, 2, 64, "eager", min_packed=0, capacity_spread=0,
                             packed_attention=packed_attention)
        runs.append(_serve(graphs, 0.3))
        if packed_attention:
            calls = packed_calls["calls"]
    (tokens, masks, stats), (ref_tokens, ref_masks, ref_stats) = runs
    assert tokens == ref_tokens and stats == ref_stats
    assert 0 < stats.folded_draft_positions < stats.gated_draft_positions
    assert all(torch.equal(a, b) for got, want in zip(masks, ref_masks) for a, b in zip(got, want))
    assert calls == packed_calls["calls"] > 0 and calls % len(model.layers) == 0


def test_bad_values_are_refused():
    model = tiny_model(FAMILIES[0])
    gen = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        pool, _, slots, rows, parents, positions = _requests(model, [3], [2], gen)
        with pytest.raises(ValueError, match=r"^packed_attention: True needs attention='ragged', got "
                                             r"attention='per_request'"):
            verify_batch_folded(model, pool, slots, rows, parents, positions, 0.2, packed_attention=True)
        with pytest.raises(ValueError, match=r"^packed_attention: expected True or False, got 'yes'"):
            verify_batch_folded(model, pool, slots, rows, parents, positions, 0.2, attention="ragged",
                                packed_attention="yes")
    with pytest.raises(ValueError, match=r"^packed_attention: expected True or False, got 1"):
        BatchGraphs(model, 2, 64, "eager", packed_attention=1)
