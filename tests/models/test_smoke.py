import torch

from specfold_compile.models import build


def test_build_and_forward_tiny():
    model = build("tiny-nld", seed=0)
    cache = model.prefill(torch.tensor([1, 5, 6, 7], dtype=torch.int64))
    tokens = torch.randint(0, 100, (2, model.config.block_size))
    logits = model(tokens, torch.tensor([-1, 0]), cache)
    assert logits.shape == (2, model.config.block_size, model.config.vocab_size)
    assert torch.isfinite(logits).all()
