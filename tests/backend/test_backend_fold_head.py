"""options={"fold_head": True}: the final norm and LM head are gated too (SPEC section 2 option), with
the same properties: P1 at tau = 0, P2 for the main row, P4 against the reference given the masks."""

import pytest
import torch

from specfold_compile.backend import SpecFoldSettings, collect_stats, run_passes
from specfold_compile.models import build
from specfold_compile.reference import folded_verify
from specfold_compile.testing import capture_graph


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def _problem(name, seed):
    model = build(name, seed=seed, num_layers=2)
    cache = model.prefill(torch.arange(1, 10))
    block = model.config.block_size
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 90, (1, block), generator=gen).repeat(5, 1)
    parents = torch.tensor([-1, 0, 1, 1, 0])
    for n in range(1, 5):
        tokens[n] = tokens[int(parents[n])]
        tokens[n, int(torch.randint(0, block, (1,), generator=gen))] = 95
    return model, cache, tokens, parents


@pytest.mark.parametrize("name", ["tiny-fast-dllm-v2", "tiny-nld"])
@pytest.mark.parametrize("gate", ["layer", "sublayer"])
def test_fold_head_properties(name, gate):
    model, cache, tokens, parents = _problem(name, seed=4)
    dense = model(tokens, parents, cache)
    for tau in (0.0, 0.3):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="specfold", options={"tau": tau, "gate": gate, "fold_head": True})
        with collect_stats() as s:
            out = compiled(tokens, parents, cache)
        n_gates = (2 if gate == "sublayer" else 1) * len(model.layers) + 1
        assert len(s.fold_masks) == n_gates
        ref, _ = folded_verify(model, tokens, parents, cache, tau, fold_masks=s.fold_masks, gate=gate,
                               fold_head=True)
        assert _rel(out, ref) < 1e-5  # P4
        assert _rel(out[0], dense[0]) < 1e-5  # P2
        if tau == 0.0:
            assert _rel(out, dense) < 1e-5 and not any(m.any() for m in s.fold_masks)  # P1
        else:
            assert s.fold_masks[-1].any(), "the head gate folded nothing at tau = 0.3"


def test_head_region_is_norm_and_head_only():
    model, cache, tokens, parents = _problem("tiny-fast-dllm-v2", seed=1)
    rewrite = run_passes(capture_graph(model, tokens, parents, cache)[0], SpecFoldSettings(tau=0.3, fold_head=True))
    head = rewrite.plan.head
    # RMSNorm (8 ops) and the tied LM head; the logit shift (slices along positions), which the model
    # applies to the hidden states before them, stays outside: the region starts at its output.
    assert len(head.nodes) == 9 and len(head.outputs) == 1
    assert "packed 9 head ops" in head.rewritten and len(head.packed_linears) == 1
    assert head.h_in.target is torch.cat and all(a.args[0] is head.h_in.args[0][0].args[0] for a in head.h_in.args[0])


def test_head_region_without_a_shift_starts_at_the_last_layer():
    model, cache, tokens, parents = _problem("tiny-nld", seed=1)
    rewrite = run_passes(capture_graph(model, tokens, parents, cache)[0], SpecFoldSettings(tau=0.3, fold_head=True))
    head = rewrite.plan.head
    assert head.h_in.target is not torch.cat and len(head.packed_linears) == 1
