"""bench.gate_calls: each variant's patches hold during its run only, rows carry the variant and the repeat,
and bad arguments are one-line errors."""
import json
import os

import pytest

from bench import gate_calls, report
from specfold_compile.kernels import gate


def test_patched_applies_each_named_patch_and_restores():
    default_config, tile_max = gate.flag_config(1536), gate.REGISTER_TILE_MAX
    with gate_calls.patched("flags_4rows_1024+resolve_global_memory"):
        assert gate.flag_config(1536) == (4, 1024, 4) and gate.flag_config(48) == (4, 64, 4)
        assert gate.REGISTER_TILE_MAX == 0
    with gate_calls.patched("default"):
        assert gate.flag_config(1536) == default_config and gate.REGISTER_TILE_MAX == tile_max
    assert gate.flag_config(1536) == default_config and gate.REGISTER_TILE_MAX == tile_max


def test_dry_run_tags_rows_and_keeps_out(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path / "elsewhere"))
    out = tmp_path / "calls.json"
    assert gate_calls.main(["--cpu-dry-run", "--repeats", "1", "--variants", "default,flags_4rows_1024",
                            "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert "default, flags_4rows_1024" in data["procedure"]
    assert {r["gate_variant"] for r in rows} == {"default", "flags_4rows_1024"}
    assert {r["repeat"] for r in rows} == {1}
    assert {r["mode"] for r in rows if r["gate_variant"] == "default"} == {"specfold", "dense_compiled"}
    assert {r["mode"] for r in rows if r["gate_variant"] == "flags_4rows_1024"} == {"specfold"}
    assert {r["n_branches"] for r in rows} == {17, 33}
    assert os.environ["OUT"] == str(tmp_path / "elsewhere")
    # the benchmarks page's table of such a file (one process: its rows carry no ``process``)
    table = [line for line in report.render_gate_calls(data) if line.startswith("| 1 | 1.5B |")]
    assert len(table) == 8 and sum("`flags_4rows_1024`" in line for line in table) == 4


@pytest.mark.parametrize("argv, named", [(["--variants", "default,resolve"], "--variants"),
                                         (["--repeats", "0"], "--repeats")])
def test_bad_arguments_are_errors(argv, named, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        gate_calls.main(argv + ["--cpu-dry-run", "--out", str(tmp_path / "x.json")])
    assert exc.value.code == 2 and named in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()

