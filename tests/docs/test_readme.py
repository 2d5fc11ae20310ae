"""The README's example runs as written, its table is the committed results', and its test command is CI's."""

import contextlib
import json
import io
import re
from pathlib import Path

import torch

from bench import report

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_readme_python_example_runs_and_prints_sane_results():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "README has no python example"
    torch._dynamo.reset()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md", "exec"), {})
    text = out.getvalue()
    assert "Spiffy decodes vanilla's tokens: True" in text  # P5: lossless
    nfe = re.search(r"NFE: vanilla (\d+), Spiffy (\d+), SpecFold (\d+)", text)
    assert nfe, text
    vanilla, spiffy, specfold = map(int, nfe.groups())
    assert 0 < spiffy <= vanilla and 0 < specfold <= vanilla
    ratio = re.search(r"SpecFold recomputed (\d+)% of the draft rows", text)
    assert ratio and 0 < int(ratio.group(1)) < 100, text  # tau = 0.1 folds some rows, not all
    answer = re.search(r"^-> (.+)$", text, flags=re.M)
    assert answer and answer.group(1).strip(), text


def test_readme_table_is_rendered_from_the_committed_results():
    table = "\n".join(report.render_headline(
        json.loads((report.RESULTS / "h200" / "per_check.json").read_text())))
    assert table in README, "regenerate: python -m bench.report --readme-table"


def test_readme_headline_is_rendered_from_the_committed_results():
    data = json.loads((report.RESULTS / "h200" / "end_to_end.json").read_text())
    table = "\n".join(report.render_e2e_headline(data))
    assert table.count("\n") > 2, "no trace-driven rows in end_to_end.json"
    assert table in README, "regenerate: python -m bench.report --readme-e2e"
    assert all(r["trace_reproduced"] for r in data["rows"] if r["trace_driven"])


def test_readme_test_command_is_the_one_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.search(r"^TRITON_INTERPRET=1 OMP_NUM_THREADS=1 (python -m pytest .*)$", README, flags=re.M)
    assert command, "README states no test command"
    assert command.group(1) in ci.splitlines()
    assert "export TRITON_INTERPRET=1" in ci and "export OMP_NUM_THREADS=1" in ci


def test_readme_is_short():
    assert len(README.splitlines()) <= 250


def test_headline_rows_need_both_compared_modes_and_dash_the_others():
    """A shape run without Spiffy eager (or vanilla) still gets its row, those cells "-"; a row without
    Spiffy under Inductor or SpecFold, whose ratio the table gives, is left out."""
    data = json.loads((report.RESULTS / "h200" / "end_to_end.json").read_text())
    traced = [r for r in data["rows"] if r["trace_driven"] and r["model"] == "fast-dllm-v2-1.5b"]
    full = report.render_e2e_headline({**data, "rows": traced})
    no_eager = report.render_e2e_headline({**data, "rows": [r for r in traced if r["mode"] != "spiffy"]})
    assert len(no_eager) == len(full) > 2
    assert all(line.split(" | ")[4] == "-" for line in no_eager[2:])
    assert [line.split(" | ")[5:] for line in no_eager] == [line.split(" | ")[5:] for line in full]
    no_baseline = report.render_e2e_headline({**data, "rows": [r for r in traced if r["mode"] != "spiffy_compiled"]})
    assert len(no_baseline) == 2  # the header and its rule only
