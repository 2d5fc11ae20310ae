"""Backend test configuration.

The Triton interpreter has to be chosen before any ``@triton.jit`` module is imported (importing
``specfold_compile`` imports the kernels), so this runs first, at collection time.
"""
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # sf_helpers

import pytest  # noqa: E402
import torch._dynamo  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Every test compiles from scratch: new models would otherwise pile up recompiles on the same code
    object until Dynamo's recompile limit silently falls back to eager (and every test would pass)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
