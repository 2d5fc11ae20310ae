"""options={"inductor": True}: the rewritten graph lowered through Inductor computes the same function."""

import pytest
import torch

from specfold_compile.backend import collect_stats
from specfold_compile.models import build
from specfold_compile.reference import folded_verify


def test_inductor_lowering_matches_reference_with_the_same_masks():
    pytest.importorskip("torch._inductor")
    model = build("tiny-nld", seed=3)
    cache = model.prefill(torch.arange(1, 12))
    block = model.config.block_size
    tokens = torch.randint(0, 90, (1, block), generator=torch.Generator().manual_seed(0)).repeat(4, 1)
    for n in range(1, 4):
        tokens[n, 2 * n] = 95  # each draft differs from its parent in one position
    parents = torch.tensor([-1, 0, 1, 0])
    compiled = torch.compile(model, backend="specfold", options={"tau": 0.3, "inductor": True, "kernels": "torch"})
    with collect_stats() as s:
        out = compiled(tokens, parents, cache)
    assert s.layers and 0 < s.recompute_ratio < 1  # the folded graph ran and folded something
    ref, _ = folded_verify(model, tokens, parents, cache, 0.3, fold_masks=s.fold_masks)
    assert float((out - ref).norm() / ref.norm()) < 1e-5
