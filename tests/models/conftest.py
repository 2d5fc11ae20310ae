"""Model tests: make the source tree importable when the package is not installed."""
import os
import sys

try:
    import specfold_compile  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    """The models here are tiny: one intra-op thread is fastest, and on a shared 2-core machine extra
    OpenMP threads spin against other processes (100x slowdowns measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
