"""The benchmark commands check where they write, and the packages they plot with, before any work: an
unusable output is one line on stderr naming it and status 2 (``bench.plot``: a UsageError), with no
model loaded, no suite run and nothing merged."""
import importlib.util
import json

import pytest

import specfold_compile.loading
from bench import head_hint, host_overhead, plot, project, run
from specfold_compile.cli.arguments import UsageError


@pytest.fixture
def blocked(tmp_path):
    """A path whose directory cannot be created (a file stands where it would be)."""
    (tmp_path / "file").write_text("")
    return tmp_path / "file" / "out.json"


@pytest.fixture
def started(monkeypatch):
    """What work began: loading the model or running a bench.run suite (each refused)."""
    calls = []

    def refuse(name):
        def call(*_args, **_kwargs):
            calls.append(name)
            raise RuntimeError(f"{name} started")

        return call

    monkeypatch.setattr(specfold_compile.loading, "load_model", refuse("load_model"))
    monkeypatch.setattr(run, "SUITES", {name: refuse(name) for name in run.SUITES})
    return calls


def _usage_error(capsys, call, name):
    with pytest.raises(SystemExit) as exc:
        call()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()  # argparse's usage lines, then the error
    assert name in err.splitlines()[-1] and "Traceback" not in err
    return err.splitlines()[-1]


def test_head_hint_and_host_overhead_check_out_first(blocked, tmp_path, started, capsys):
    for main in (head_hint.main, host_overhead.main):
        assert "is a file, expected a directory" in _usage_error(capsys, lambda: main(["--out", str(blocked)]),
                                                                 "--out")
        assert "is a directory, expected a file" in _usage_error(capsys, lambda: main(["--out", str(tmp_path)]),
                                                                 "--out")
        with pytest.raises(RuntimeError, match="load_model started"):  # a writable --out: the work begins
            main(["--out", str(tmp_path / "new" / "out.json")])
    assert started == ["load_model", "load_model"]


def test_run_checks_its_results_directory_first(blocked, started, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(blocked.parent))  # a file
    assert "is a file" in _usage_error(capsys, lambda: run.main(["--suite", "check", "--cpu-dry-run"]), "OUT")
    assert started == []


def _without_matplotlib(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.split(".")[0] == "matplotlib" else find_spec(name, *a))


def test_run_checks_matplotlib_before_a_plotted_suite(tmp_path, started, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    _without_matplotlib(monkeypatch)
    plotted = next(iter(run.PLOTS))
    assert "needs matplotlib" in _usage_error(
        capsys, lambda: run.main(["--suite", plotted, "--cpu-dry-run"]), "matplotlib")
    assert started == []
    unplotted = next(s for s in run.SUITES if s not in run.PLOTS)  # needs no matplotlib: it runs
    assert run.main(["--suite", unplotted, "--cpu-dry-run"]) == 1 and started == [unplotted]


def test_plot_checks_before_merging(tmp_path, blocked, monkeypatch):
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps({"suite": "per_check", "rows": []}))
    with pytest.raises(UsageError, match="^OUT: "):
        plot.main([str(blocked), str(run_file)])
    assert not blocked.parent.is_dir()
    _without_matplotlib(monkeypatch)
    merged = tmp_path / "merged.json"
    with pytest.raises(UsageError, match="needs matplotlib"):
        plot.main([str(merged), str(run_file)])
    assert not merged.exists()


def test_project_checks_end_to_end_is_writable(tmp_path, capsys):
    per_check = tmp_path / "per_check.json"
    per_check.write_text(json.dumps({"rows": []}))
    line = _usage_error(capsys, lambda: project.main([str(tmp_path), str(per_check)]), "end_to_end")
    assert "is a directory" in line
