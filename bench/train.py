"""Train the shipped tiny Fast-dLLM-v2-layout model: ``PYTHONPATH=. python bench/train.py --out DIR --minutes 8 --seed 0``."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from specfold_compile.training.train import main  # noqa: E402

if __name__ == "__main__":
    main(sys.argv[1:])
