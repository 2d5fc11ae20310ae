"""docs/benchmarks.md is what ``python -m bench.report`` renders from the committed result files."""

import json
from pathlib import Path

from bench import report

ROOT = Path(__file__).resolve().parents[2]


def test_committed_benchmarks_page_equals_the_generator_output():
    committed = (ROOT / "docs" / "benchmarks.md").read_text()
    assert committed == report.render(), "regenerate: python -m bench.report > docs/benchmarks.md"


def test_every_section_has_its_result_file():
    # a section whose file is missing would silently vanish from the page
    for section in report.SECTIONS:
        assert (report.RESULTS / section.path).is_file(), section.path


def test_per_check_table_reads_the_rows_it_prints(tmp_path):
    # a tiny hand-made result file: the rendered cells are its numbers and their ratios
    rows = [
        {"model": "fast-dllm-v2-1.5b", "prefix": 512, "n_branches": 17, "mode": "dense", "ms": 8.0},
        {"model": "fast-dllm-v2-1.5b", "prefix": 512, "n_branches": 17, "mode": "dense_compiled", "ms": 5.0},
        {"model": "fast-dllm-v2-1.5b", "prefix": 512, "n_branches": 17, "mode": "specfold", "ms": 2.0,
         "target_ratio": 0.25, "recompute_ratio": 0.1875, "folded": True},
        {"model": "fast-dllm-v2-1.5b", "prefix": 512, "n_branches": 17, "mode": "floor", "ms": 1.0,
         "target_ratio": 0.25},
    ]
    lines = report.render_per_check({"rows": rows})
    row = next(line for line in lines if line.startswith("| 17 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:3] == ["17", "8.00", "5.00"]
    assert "2.00" in cells and "(plain)" not in row
    assert cells[-4:] == ["0.25x", "0.40x", "1.00", "2.00x"]
    assert any("r=0.19" in line for line in lines)


def test_versions_line_names_the_gpu_and_every_run():
    data = {"versions": {"gpu": "G", "driver": "1", "torch": "t1"},
            "runs": [{"versions": {"gpu": "G", "driver": "1", "torch": "t1"}},
                     {"versions": {"gpu": "H", "torch": "t2"}}]}
    assert report._versions(data) == "G (driver 1); torch t1; H; torch t2"
    assert json.loads(json.dumps(data)) == data  # the helper does not modify its input
