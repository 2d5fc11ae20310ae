"""SPEC section 3 properties of ``torch.compile(model, backend="specfold")`` over random configurations.

Random configs: 1-3 layers, hidden 32-128, MHA and GQA, head_dim mostly different from hidden/heads,
q/k/v bias on and off, both families; draft trees with N = 1..9, Spiffy-like (drafts equal to their
parent except in a few positions, so folding happens) or random.
"""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specfold_compile.testing import (ModelSpec, assert_close, check_gates_near_threshold, compile_run,
                                      expected_layer0_mask, hsettings, make_cache, make_tree, model_specs,
                                      recording_reference_gates)
from specfold_compile.reference import folded_verify

SWITCHES = [{}, {"pack": False}, {"attention_correction": False}]
options_st = st.builds(lambda gate, sw: {"gate": gate, **sw}, st.sampled_from(["layer", "sublayer"]),
                       st.sampled_from(SWITCHES))
trees = st.tuples(st.integers(1, 9), st.sampled_from(["realistic", "random"]), st.integers(0, 2**16))


@hsettings(10)
@given(spec=model_specs(), tree=trees, options=options_st)
def test_p1_tau0_equals_dense(spec, tree, options):
    model = spec.build()
    cache = make_cache(model, seed=spec.seed)
    tokens, parents = make_tree(model, *tree)
    dense = model(tokens, parents, cache)
    out, s, _ = compile_run(model, tokens, parents, cache, tau=0.0, **options)
    assert not any(m.any() for m in s.fold_masks), "tau = 0 must fold nothing"
    assert_close(out, dense, what="compiled tau=0 vs eager dense")


# Prefix lengths: 57 puts the block across position 64, where the tiny NLD preset's Llama-4 query scaling
# steps, so every position-dependent table packed into the regions really varies along the block.
prompts = st.sampled_from([1, 7, 57])


@hsettings(8)
@given(spec=model_specs(), tree=trees, tau=st.sampled_from([0.0, 0.05, 0.3, 0.8, 5.0]), options=options_st,
       prompt_len=prompts)
def test_p2_main_row_equals_single_branch(spec, tree, tau, options, prompt_len):
    model = spec.build()
    cache = make_cache(model, prompt_len=prompt_len, seed=spec.seed)
    tokens, parents = make_tree(model, *tree)
    single = model(tokens[:1], parents[:1], cache)
    out, s, _ = compile_run(model, tokens, parents, cache, tau=tau, **options)
    assert not any(m[0].any() for m in s.fold_masks), "row 0 never folds"
    assert_close(out[:1], single, what=f"main row at tau={tau}")


def _check_p4(model, tokens, parents, cache, tau, options):
    """Compiled vs reference.folded_verify with the compiled fold masks forced; the compiled gates vs the
    SPEC gate on the reference's residual streams (forced and free-running)."""
    gate = options.get("gate", "layer")
    out, s, _ = compile_run(model, tokens, parents, cache, tau=tau, **options)
    if tokens.shape[0] == 1:  # the plain graph ran (compile_run checked no gate did): dense is the reference
        assert_close(out, model(tokens, parents, cache), what="one branch: compiled vs eager")
        return out, s
    masks = s.fold_masks
    with recording_reference_gates() as forced_states:
        ref, used = folded_verify(model, tokens, parents, cache, tau, fold_masks=masks, gate=gate)
    assert all(torch.equal(a, b.cpu()) for a, b in zip(used, masks))
    assert_close(out, ref, what=f"compiled vs reference with forced masks (tau={tau}, {options})")
    # Gates on their own: same decisions except within rounding of the threshold.
    check_gates_near_threshold(masks, forced_states, tau)
    with recording_reference_gates() as free_states:
        _, free_masks = folded_verify(model, tokens, parents, cache, tau, gate=gate)
    for i, (a, b) in enumerate(zip(masks, free_masks)):
        if not torch.equal(a.cpu(), b.cpu()):  # up to here both ran the same folds: near threshold only
            check_gates_near_threshold([a], [free_states[i]], tau)
            break
    return out, s


@hsettings(14)
@given(spec=model_specs(), tree=trees, tau=st.sampled_from([0.02, 0.1, 0.3, 0.5]), options=options_st,
       prompt_len=prompts)
def test_p4_matches_reference_given_masks(spec, tree, tau, options, prompt_len):
    model = spec.build()
    cache = make_cache(model, prompt_len=prompt_len, seed=spec.seed)
    tokens, parents = make_tree(model, *tree)
    out, s = _check_p4(model, tokens, parents, cache, tau, options)
    if tokens.shape[0] > 1:
        # The first gate reads the embeddings: a draft position folds exactly when it repeats its parent's token.
        assert torch.equal(s.fold_masks[0].cpu(), expected_layer0_mask(tokens, parents))
    if tree[1] == "realistic" and tokens.shape[0] > 1:
        assert s.folded_rows > 0 and s.recompute_ratio < 1


@pytest.mark.parametrize("family", ["fast-dllm-v2", "nld"])
@pytest.mark.parametrize("gate", ["layer", "sublayer"])
def test_p4_every_bisection_switch(family, gate):
    """Spiffy-like tree at a moderate tau: folding happens in every layer, every switch matches the
    reference given the masks, and the switches agree with each other (same results, SPEC)."""
    spec = ModelSpec(family=family, layers=2, seed=3)
    model = spec.build()
    cache = make_cache(model, prompt_len=57, seed=1)
    tokens, parents = make_tree(model, 7, "realistic", 11)
    results = []
    for switch in SWITCHES:
        out, s = _check_p4(model, tokens, parents, cache, 0.3, {"gate": gate, **switch})
        assert all(m.any() for m in s.fold_masks), f"expected folds at every gate: {s.layers}"
        assert 0 < s.recompute_ratio < 1
        results.append((out, s.fold_masks))
    base_out, base_masks = results[0]
    for out, masks in results[1:]:
        if all(torch.equal(a, b) for a, b in zip(base_masks, masks)):
            assert_close(out, base_out, what="bisection switch vs default")


def test_p1_realistic_tree_is_exact_despite_identical_rows():
    """tau = 0 with drafts that repeat their parent almost everywhere: nothing folds (strict <)."""
    model = ModelSpec(family="nld", layers=3, seed=5).build()
    cache = make_cache(model)
    tokens, parents = make_tree(model, 9, "realistic", 2)
    tokens[3] = tokens[int(parents[3])]  # a draft identical to its parent: residual exactly 0, 0 < 0 * x is False
    out, s, _ = compile_run(model, tokens, parents, cache, tau=0.0)
    assert s.folded_rows == 0 and s.recompute_ratio == 1.0
    assert_close(out, model(tokens, parents, cache), what="tau=0")

