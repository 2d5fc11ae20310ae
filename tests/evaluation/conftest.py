"""Evaluation tests: one thread (the CI machine has 2 shared cores) and a fresh Dynamo per test."""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch._dynamo  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
