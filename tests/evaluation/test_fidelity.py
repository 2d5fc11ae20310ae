"""The draft-fidelity helpers on hand-made logits."""
import math

import pytest
import torch

from specfold_compile.eval import FidelityRecorder, fidelity_positions, summarize_fidelity

M = 0  # mask id


def _setup():
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(3, 4, 5, generator=g)
    tokens = torch.tensor([[7, M, M, M],      # main: never scored
                           [7, 8, M, M],      # row 1 (parent 0): positions 2, 3
                           [7, 8, 9, M]])     # row 2 (parent 1): position 3
    parents = torch.tensor([-1, 0, 1])
    return dense, tokens, parents


def test_selects_masked_draft_positions_only():
    dense, tokens, parents = _setup()
    out = fidelity_positions(dense.clone(), dense, tokens, parents, M)
    assert all(v.shape == (3,) for v in out.values())


def test_identical_folded_is_exact():
    dense, tokens, parents = _setup()
    out = fidelity_positions(dense.clone(), dense, tokens, parents, M)
    assert torch.all(out["fold_agree"] == 1)
    assert torch.all(out["fold_relerr"] == 0)


def test_copy_of_identical_parent_is_exact():
    dense, tokens, parents = _setup()
    dense[1] = dense[0]
    dense[2] = dense[0]
    out = fidelity_positions(dense + 1.0, dense, tokens, parents, M)
    assert torch.all(out["copy_agree"] == 1)
    assert torch.all(out["copy_relerr"] == 0)
    assert torch.all(out["fold_relerr"] > 0)


def test_relative_error_and_argmax_by_hand():
    dense = torch.zeros(2, 2, 3)
    dense[0, 1] = torch.tensor([0.0, 3.0, 4.0])   # parent: argmax 2
    dense[1, 1] = torch.tensor([3.0, 4.0, 0.0])   # child: argmax 1, norm 5
    folded = dense.clone()
    folded[1, 1] = torch.tensor([3.0, 4.0, 5.0])  # error norm 5 -> rel 1, argmax 2 (wrong)
    tokens = torch.tensor([[5, M], [5, M]])
    out = fidelity_positions(folded, dense, tokens, torch.tensor([-1, 0]), M)
    assert out["fold_relerr"].tolist() == pytest.approx([1.0])
    assert out["fold_agree"].tolist() == [0.0]
    assert out["copy_relerr"].tolist() == pytest.approx([math.sqrt(9 + 1 + 16) / 5])
    assert out["copy_agree"].tolist() == [0.0]


def test_summary_quantiles_and_empty():
    parts = {"fold_agree": [torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])],
             "fold_relerr": [torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0])],
             "copy_agree": [torch.ones(2), torch.ones(2)],
             "copy_relerr": [torch.zeros(2), torch.zeros(2)]}
    s = summarize_fidelity(parts)
    assert s["positions"] == 4
    assert s["fold_argmax_agree"] == pytest.approx(0.75)
    assert s["fold_relerr_median"] == pytest.approx(1.5)
    assert s["fold_relerr_p99"] == pytest.approx(2.97)
    assert s["copy_argmax_agree"] == 1.0 and s["copy_relerr_p99"] == 0.0
    empty = summarize_fidelity({k: [] for k in parts})
    assert empty["positions"] == 0 and math.isnan(empty["fold_relerr_median"])


def test_recorder_returns_dense_and_tau0_matches():
    from specfold_compile.loading import encode, load_model

    model = load_model(None)
    rec = FidelityRecorder(model, [0.0, 0.5])
    cache = rec.prefill(encode(model, "Tom has 3 apples."))
    B, mask = model.config.block_size, model.config.mask_token_id
    tokens = torch.full((3, B), mask, dtype=torch.long)
    tokens[:, 0] = 5
    tokens[1, 1] = 6
    tokens[2, 1:3] = torch.tensor([6, 7])
    parents = torch.tensor([-1, 0, 1])
    with torch.inference_mode():
        out = rec(tokens, parents, cache)
        ref = model(tokens, parents, cache)
    torch.testing.assert_close(out, ref)
    s = rec.summary()
    assert rec.measured_calls == 1
    assert s[0.0]["positions"] == (B - 2) + (B - 3)
    assert s[0.0]["fold_argmax_agree"] == 1.0 and s[0.0]["fold_relerr_p99"] < 1e-4  # P1
    assert s[0.5]["fold_relerr_median"] >= s[0.0]["fold_relerr_median"]
