"""``collect_stats()``: its result's repr shows what the gates recorded."""

import torch

from specfold_compile.ops import stats
from specfold_compile.ops.stats import collect_stats


def _gate_call(seed: int, tau: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(3, 4, 8, generator=g)
    h[2] = h[1] + 1e-3 * torch.randn(4, 8, generator=g)  # row 2 close to its parent: folds at tau 0.5
    fold, *_ = torch.ops.specfold.fold_gate(h, torch.tensor([-1, 0, 1]), torch.tensor(tau), 0, True, "torch")
    return fold


def test_repr_reports_recorded_numbers():
    with collect_stats() as s:
        fold = _gate_call(0, 0.5)
        stats.record_plain_call()
    folded = int(fold.sum())
    assert folded >= 4  # row 2 folds everywhere
    text = repr(s)
    assert text.startswith("FoldStats(") and "calls=1," in text and "plain_calls=1," in text
    assert f"folded_rows={folded}" in text and "gates=1" in text
    assert f"recompute_ratio={(8 - folded) / 8:.3f}" in text


def test_repr_of_an_empty_collector():
    with collect_stats() as s:
        pass
    assert repr(s) == ("FoldStats(calls=0, plain_calls=0, launched_plain_calls=0, gates=0, recompute_ratio=nan, "
                       "folded_rows=0, chain_lengths={}, invalid_parent_calls=0)")


def test_collect_stats_is_documented():
    doc = collect_stats.__doc__ or ""
    assert "recompute_ratio" in doc and "plain_calls" in doc
