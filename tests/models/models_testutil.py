"""Shared helpers of the model tests: random draft trees, tolerances, sequence masks."""
from __future__ import annotations

import torch

FAMILY_PRESETS = ("tiny-fast-dllm-v2", "tiny-nld")


def random_tree(gen: torch.Generator, n_rows: int, block: int, vocab: int, mask_id: int,
                max_changes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [N, B] and parents [N]: row 0 is a partly masked block; each draft copies a random earlier
    row (parents[n] < n) and replaces 1..max_changes of its positions."""
    tokens = torch.randint(0, vocab, (n_rows, block), generator=gen)
    masked = torch.rand(block, generator=gen) < 0.5
    tokens[0, masked] = mask_id
    parents = torch.full((n_rows,), -1, dtype=torch.int64)
    for n in range(1, n_rows):
        p = int(torch.randint(0, n, (1,), generator=gen))
        parents[n] = p
        tokens[n] = tokens[p]
        k = int(torch.randint(1, max_changes + 1, (1,), generator=gen))
        where = torch.randperm(block, generator=gen)[:k]
        tokens[n, where] = torch.randint(0, vocab, (k,), generator=gen)
    return tokens, parents


def assert_close(a: torch.Tensor, b: torch.Tensor, tol: float = 2e-4) -> None:
    """Float32 comparison relative to the scale of the logits (different matmul shapes round
    differently in the last bits)."""
    scale = max(1.0, float(b.abs().max()))
    err = float((a.float() - b.float()).abs().max())
    assert err <= tol * scale, f"max abs error {err} > {tol} * {scale}"


def prefix_then_block_mask(prefix_len: int, block: int) -> torch.Tensor:
    """bool [S, S]: the prefix is causal; block rows attend to the whole prefix and their whole block."""
    s = prefix_len + block
    allowed = torch.ones(s, s, dtype=torch.bool).tril()
    allowed[prefix_len:, :] = True
    return allowed


def additive(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """bool [S, S] -> additive float mask [1, 1, S, S] (eager attention needs float, not bool)."""
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]
