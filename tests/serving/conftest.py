"""Serving tests: the real tiny models of both families (random weights, float32, CPU), one thread."""
import os
import sys

try:
    import specfold_compile  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import pytest  # noqa: E402
import torch  # noqa: E402

FAMILIES = ["tiny-fast-dllm-v2", "tiny-nld"]


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny matmuls: extra OpenMP threads on a shared machine cost far more than they give."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


_MODELS: dict = {}


def tiny_model(name: str):
    """One seeded model per family for the whole run (hypothesis tests cannot take function fixtures)."""
    from specfold_compile.models import build

    if name not in _MODELS:
        _MODELS[name] = build(name, seed=0)
    return _MODELS[name]


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return tiny_model(request.param)
