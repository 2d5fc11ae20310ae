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
    """A shape run without Spiffy eager (or vanilla) still gets its row, those cells "-"; a mode no row has
    is no column; a row without Spiffy under Inductor or SpecFold, whose ratio the table gives, is left out;
    the boundaries column shows only where rows differ in it."""
    data = json.loads((report.RESULTS / "h200" / "end_to_end.json").read_text())
    traced = [r for r in data["rows"] if r["trace_driven"] and r["mode"] != "spiffy"]
    eager = [{**r, "mode": "spiffy", "tokens_per_s": r["tokens_per_s"] / 2} for r in traced
             if r["mode"] == "spiffy_compiled"]
    shapes = {r["model"] for r in traced}
    assert len(shapes) >= 2, "the headline data needs two shapes"
    one = sorted(shapes)[0]
    full = report.render_e2e_headline({**data, "rows": traced + eager})
    partial = report.render_e2e_headline({**data, "rows": traced + [r for r in eager if r["model"] == one]})
    none = report.render_e2e_headline({**data, "rows": traced})
    assert len(full) == len(partial) == len(none) > 2
    assert "Spiffy, eager (tokens/s)" in full[0] == partial[0] and "Spiffy, eager" not in none[0]
    column = full[0].split(" | ").index("Spiffy, eager (tokens/s)")
    dashed = [line.split(" | ")[column] == "-" for line in partial[2:]]
    assert any(dashed) and not all(dashed)
    assert [line.split(" | ")[column + 1:] for line in partial] == [line.split(" | ")[column + 1:] for line in full]
    assert "block boundaries" not in full[0]
    fused = [{**r, "fuse_boundaries": True} for r in traced]
    assert "block boundaries" in report.render_e2e_headline({**data, "rows": traced + fused})[0]
    no_baseline = report.render_e2e_headline({**data, "rows": [r for r in traced if r["mode"] != "spiffy_compiled"]})
    assert len(no_baseline) == 2  # the header and its rule only
