"""The README's usage example runs as written."""

import re
from pathlib import Path

import torch


def test_readme_python_example_runs():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks, "README has no python example"
    torch._dynamo.reset()
    exec(compile(blocks[0], "README.md", "exec"), {})
