"""Configuration of the whole test suite (the only conftest.py; shared helpers: ``specfold_compile.testing``).

At import, before anything imports the ``@triton.jit`` kernels (importing ``specfold_compile`` does):

- without CUDA, Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``), patched to compute
  bf16 as a GPU does (``specfold_compile.testing.install_interpreter_bf16_patch``);
- one intra-op thread: the models and kernels here are tiny, and on a shared 2-core machine extra OpenMP
  threads spin against the other worker (100x slowdowns measured).

Fixtures: every test starts with one thread (autouse); kernel outputs are poisoned (autouse, session);
tests under ``backend/`` and ``evaluation/`` start with a fresh Dynamo (autouse); ``model``: the real tiny
models of both families.
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch._dynamo  # noqa: E402

from specfold_compile import testing  # noqa: E402
from specfold_compile.kernels import triton_available  # noqa: E402

torch.set_num_threads(1)

# the Triton launchers can run here: triton imports, and CUDA or the interpreter
TRITON = triton_available()
if TRITON and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    testing.install_interpreter_bf16_patch()

TESTS = os.path.dirname(os.path.abspath(__file__))
# these directories compile new models test after test: a fresh Dynamo each (see _fresh_dynamo)
FRESH_DYNAMO_DIRS = {"backend", "evaluation"}


def pytest_configure(config):
    # triton's interpreter converts 1-element arrays to Python ints (numpy deprecation noise)
    config.addinivalue_line("filterwarnings", "ignore:Conversion of an array with ndim > 0:DeprecationWarning")


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread in every test, whatever an earlier test left behind."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _fresh_dynamo(request):
    """Under backend/ and evaluation/ every test compiles from scratch: new models would otherwise pile up
    recompiles on the same code object until Dynamo's recompile limit silently falls back to eager (and
    every test would pass)."""
    fresh = os.path.relpath(request.path, TESTS).split(os.sep)[0] in FRESH_DYNAMO_DIRS
    if fresh:
        torch._dynamo.reset()
    yield
    if fresh:
        torch._dynamo.reset()


def _poison_empty(shape, dtype, device):
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.ones(shape, dtype=dtype, device=device)
    if dtype == torch.int8:
        return torch.full(shape, 1, dtype=dtype, device=device)
    return torch.full(shape, -987654321, dtype=dtype, device=device)


@pytest.fixture(autouse=True, scope="session")
def poison_outputs():
    """Every Triton launcher allocates its outputs through ``kernels._common.empty``: fill them with garbage,
    so a kernel that leaves an output unwritten fails (in every test, from the first on)."""
    if not TRITON:
        yield
        return
    from specfold_compile.kernels import _common

    orig = _common.empty
    _common.empty = _poison_empty
    try:
        yield
    finally:
        _common.empty = orig


@pytest.fixture(scope="module", params=["tiny-fast-dllm-v2", "tiny-nld"])
def model(request):
    """The real tiny models of both families (random weights, float32, CPU); a module may override it."""
    from specfold_compile.models import build

    return build(request.param, seed=0)
