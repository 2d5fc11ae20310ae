"""Train the shipped tiny Fast-dLLM-v2 model (GPU): ``python -m bench.train --out DIR --minutes 7.5 --seed 0``
from the repository root (or ``specfold train``); see ``specfold_compile/training/train.py`` for the options."""

import sys

from specfold_compile.training.train import main

if __name__ == "__main__":
    main(sys.argv[1:])
