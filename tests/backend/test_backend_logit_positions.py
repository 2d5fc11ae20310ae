"""``logit_positions`` under the backend: the layers still fold, and the selected logits are the full
forward's rows (the decode loop asks for the masked positions only)."""

import contextlib

import pytest
import torch

from specfold_compile.backend import SpecFoldSettings, collect_stats, run_passes
from specfold_compile.testing import ModelSpec, assert_close, capture_graph, make_cache, make_tree


def _masked_positions(model, tokens):
    return (tokens == model.config.mask_token_id).flatten().nonzero().flatten()


@pytest.mark.parametrize("family", ["fast-dllm-v2", "nld"])
@pytest.mark.parametrize("fold_head", [False, True])
def test_folded_logits_at_masked_positions(family, fold_head):
    model = ModelSpec(family=family, layers=2, seed=5).build()
    cache = make_cache(model, prompt_len=23, seed=2)
    tokens, parents = make_tree(model, 7, "realistic", 3)
    positions = _masked_positions(model, tokens)
    assert 0 < positions.numel() < tokens.numel()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="specfold", options={"tau": 0.3, "fold_head": fold_head})
    with collect_stats() as full_stats:
        full = compiled(tokens, parents, cache)
    # the head gate cannot run on selected rows: with fold_head the backend says so when it compiles
    warns = pytest.warns(UserWarning, match="fold_head=True") if fold_head else contextlib.nullcontext()
    with warns, collect_stats() as s:
        some = compiled(tokens, parents, cache, logit_positions=positions)
    # every layer's gate ran and folded, with the same decisions as the full forward
    assert len(s.fold_masks) == len(model.layers) and s.folded_rows > 0
    assert all(torch.equal(a, b) for a, b in zip(s.fold_masks, full_stats.fold_masks[:len(model.layers)]))
    if not fold_head:
        assert_close(some, full.flatten(0, 1)[positions], what="selected rows vs full folded forward")
    else:  # the head gate cannot run on selected rows: the head stays dense there, and says so
        dense_head = torch.compile(model, backend="specfold", options={"tau": 0.3})
        assert_close(some, dense_head(tokens, parents, cache).flatten(0, 1)[positions], what="fold_head")


def test_fold_head_note_with_logit_positions():
    model = ModelSpec(family="fast-dllm-v2", layers=2, seed=1).build()
    cache = make_cache(model, seed=1)
    tokens, parents = make_tree(model, 5, "realistic", 1)
    gm, _ = capture_graph(model, tokens, parents, cache, _masked_positions(model, tokens))
    with pytest.warns(UserWarning, match="fold_head=True.*head runs dense"):
        analysis = run_passes(gm, SpecFoldSettings(tau=0.3, fold_head=True)).plan
    assert analysis.head is None and len(analysis.layers) == 2
    assert any("fold_head" in note for note in analysis.notes), analysis.notes
