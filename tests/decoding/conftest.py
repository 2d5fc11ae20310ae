import os
import sys

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls: thread oversubscription on a shared 2-core box costs 100x."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module", params=["tiny-fast-dllm-v2", "tiny-nld"])
def model(request):
    """The real tiny models of both families (random weights, float32, CPU); a module may override it."""
    from specfold_compile.models import build

    return build(request.param, seed=0)
