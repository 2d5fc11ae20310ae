"""Kernel test configuration: interpreter on CPU machines, bf16 interpreter patch, poisoned outputs."""
import os

import torch

if not torch.cuda.is_available():
    # must happen before any module with @triton.jit is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

try:
    import triton  # noqa: F401
    HAVE_TRITON = True
except Exception:  # pragma: no cover
    HAVE_TRITON = False

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

if HAVE_TRITON and INTERPRET:
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import triton_interp_patch  # tests/triton_interp_patch.py

    triton_interp_patch.install()


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
    """Every launcher allocates its outputs through _common.empty: fill them with garbage.
    (Session scope: hypothesis rejects function-scoped fixtures in @given tests.)"""
    if not HAVE_TRITON or not (INTERPRET or torch.cuda.is_available()):
        yield
        return
    from specfold_compile.kernels import _common

    orig = _common.empty
    _common.empty = _poison_empty
    try:
        yield
    finally:
        _common.empty = orig


def pytest_configure(config):
    # triton's interpreter converts 1-element arrays to Python ints (numpy deprecation noise)
    config.addinivalue_line("filterwarnings", "ignore:Conversion of an array with ndim > 0:DeprecationWarning")
