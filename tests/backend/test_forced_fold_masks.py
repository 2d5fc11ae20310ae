"""Fold masks recorded from a compiled call and forced on one (``ops.fold_masks``): a forced call computes
what the reference computes with those masks (P4), and the masks recorded are the masks used."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from specfold_compile.testing import ModelSpec, assert_close, make_cache, make_tree
from specfold_compile.backend import SpecFoldBackend, collect_stats
from specfold_compile.ops.fold_masks import forced_fold_masks, recorded_fold_masks
from specfold_compile.reference import folded_verify

N_ROWS, LAYERS = 6, 2


@pytest.fixture(scope="module")
def folded():
    model = ModelSpec(family="fast-dllm-v2", layers=LAYERS, block=8, seed=2).build()
    cache = make_cache(model, seed=4)
    compiled = torch.compile(model, backend=SpecFoldBackend(tau=0.2, kernels="torch", fold_min_branches=1))
    return model, cache, compiled


def _random_masks(seed: int, rows: int, block: int, p: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    masks = torch.rand(LAYERS, rows, block, generator=g) < p
    masks[:, 0] = False  # the main row never folds
    return masks


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), p=st.sampled_from([0.0, 0.3, 0.8, 1.0]))
def test_forced_masks_give_the_reference_with_those_masks(folded, seed, p):
    model, cache, compiled = folded
    tokens, parents = make_tree(model, N_ROWS, "realistic", seed % 97)
    masks = _random_masks(seed, N_ROWS + 2, tokens.shape[1], p)  # a buffer with room for larger calls
    with forced_fold_masks(masks), recorded_fold_masks() as seen, collect_stats() as s:
        out = compiled(tokens, parents, cache)
    assert s.calls == 1, "the folded graph did not run"
    used = [m[:N_ROWS] for m in masks]
    assert [g for g, _ in seen] == list(range(LAYERS))
    for (_, mask), want in zip(seen, used):
        assert torch.equal(mask, want)
    ref, _ = folded_verify(model, tokens, parents, cache, 0.2, fold_masks=used)
    assert_close(out, ref, what=f"p={p}")


def test_recorded_masks_are_the_gates_own(folded):
    model, cache, compiled = folded
    tokens, parents = make_tree(model, N_ROWS, "realistic", 3)
    with recorded_fold_masks() as seen, collect_stats() as s:
        out = compiled(tokens, parents, cache)
    assert [g for g, _ in seen] == list(range(LAYERS))
    assert all(torch.equal(m, ref) for (_, m), ref in zip(seen, s.fold_masks))
    ref, _ = folded_verify(model, tokens, parents, cache, 0.2, fold_masks=[m for _, m in seen])
    assert_close(out, ref)


def test_forced_masks_must_cover_the_call(folded):
    model, cache, compiled = folded
    tokens, parents = make_tree(model, N_ROWS, "realistic", 1)
    with pytest.raises(Exception, match="do not cover gate"):
        with forced_fold_masks(_random_masks(0, N_ROWS - 1, tokens.shape[1], 0.5)):
            compiled(tokens, parents, cache)
    with pytest.raises(ValueError, match="masks: expected a bool tensor"):
        with forced_fold_masks(torch.zeros(2, 3, 8)):
            pass
