"""Training our small Fast-dLLM-v2-layout block-diffusion LM on the synthetic tasks (see ``train.py``)."""


def train_cli(argv=None) -> int:
    """``specfold train --out DIR [--minutes 8] [--seed 0] [--steps N]`` (same as ``bench/train.py``)."""
    from .train import main

    main(argv)
    return 0
