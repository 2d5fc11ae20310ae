"""The ``specfold_graphs`` logging artifact: off by default; ``torch._logging.set_logs`` turns it on, and then
every compile logs the graph after each pass (inserted nodes annotated) and the region report."""
import logging

import pytest
import torch

from specfold_compile.testing import ModelSpec, make_cache, make_tree
from specfold_compile.backend import SpecFoldBackend, logs
from specfold_compile.passes import REWRITES


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def artifact_messages():
    """The artifact logger's messages; torch's logging settings put back afterwards."""
    handler = Collect()
    yield handler
    logs.graphs_log.removeHandler(handler)
    torch._logging.set_logs()


def _compile():
    model = ModelSpec(family="fast-dllm-v2", layers=2, block=8, seed=1).build()
    cache = make_cache(model)
    tokens, parents = make_tree(model, 4, "realistic", 3)
    backend = SpecFoldBackend(tau=0.3, kernels="torch")
    torch.compile(model, backend=backend)(tokens, parents, cache)
    (record,) = backend.graphs
    return record


def test_artifact_is_off_by_default(artifact_messages):
    torch._logging.set_logs()
    logs.graphs_log.addHandler(artifact_messages)
    assert not logs.graphs_log.isEnabledFor(logging.DEBUG)
    _compile()
    assert artifact_messages.messages == []


def test_set_logs_shows_every_pass_and_the_region_report(artifact_messages):
    torch._logging.set_logs(modules={logs.GRAPHS_ARTIFACT: True})
    logs.graphs_log.addHandler(artifact_messages)  # after set_logs: it resets the loggers' handlers
    record = _compile()
    messages = artifact_messages.messages
    steps = [m.split("\n", 1)[0] for m in messages if m.startswith("specfold graph after step")]
    names = ["input"] + [name for name, _ in REWRITES]
    assert steps == [f"specfold graph after step {i:02d} ({name}):" for i, name in enumerate(names)]
    final = [m for m in messages if m.startswith(f"specfold graph after step {len(names) - 1:02d}")][0]
    assert "# nodes inserted by specfold (node: region, role):" in final
    assert "layer 0" in final.split("# nodes inserted by specfold", 1)[1]
    assert record.report in messages


def test_torch_logs_environment_turns_it_on():
    """torch reads TORCH_LOGS when it is imported, before this package registers its names: the variable
    names the package's module, and the artifact follows it."""
    import os
    import subprocess
    import sys

    probe = ("import logging, specfold_compile.backend.logs as logs; "
             "print(logs.graphs_log.isEnabledFor(logging.DEBUG))")
    env = dict(os.environ, TORCH_LOGS="+specfold_compile")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"
