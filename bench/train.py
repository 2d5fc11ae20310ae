"""Train the shipped tiny Fast-dLLM-v2 model (GPU): ``PYTHONPATH=. python -m bench.train --out DIR --minutes 7.5
--seed 0`` (or ``python bench/train.py ...``); see ``specfold_compile/training/train.py`` for the options."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from specfold_compile.training.train import main  # noqa: E402

if __name__ == "__main__":
    main(sys.argv[1:])
