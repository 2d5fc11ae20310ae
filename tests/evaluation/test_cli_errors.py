"""The command line's user errors: one line on stderr, status 2, before anything loads or any work runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specfold_compile import loading
from specfold_compile.cli import demo, dump, eval_commands, generate, main
from specfold_compile.eval import SWEEP_FIDELITY_COLUMNS
from specfold_compile.models import build

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def no_loading(monkeypatch):
    """Any attempt to load a model fails the test: the error must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    for module in (loading, eval_commands, generate, demo, dump):
        monkeypatch.setattr(module, "load_model", refuse)
    monkeypatch.setattr("specfold_compile.decoding.calibration._load_model", refuse)
    monkeypatch.setattr("specfold_compile.training.train.main", refuse)


def _user_error(argv, capsys) -> str:
    """Run ``specfold ARGV``; it must exit with status 2 and end stderr with one error line (argparse's
    own errors add their usage lines first). Returns that line."""
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and "Traceback" not in "\n".join(lines)
    assert lines[-1].startswith(f"specfold {argv[0]}: error: "), lines
    if not lines[-1].split("error: ", 1)[1].startswith("argument "):
        assert len(lines) == 1, lines  # our checks: exactly one line, no usage
    return lines[-1]


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "not_json.json").write_text("{nodes")
    (tmp_path / "deep.json").write_text("[" * 50_000 + "]" * 50_000)
    (tmp_path / "graph16.json").write_text(json.dumps({"version": 1, "block_size": 16, "nodes": []}))
    return tmp_path


@pytest.mark.parametrize("args,expected", [
    (["--tau", "-1"], "argument --tau: expected a number >= 0"),
    (["--tau", "nan"], "argument --tau"),
    (["--tau", "abc"], "argument --tau"),
    (["--draft-budget", "-1"], "argument --draft-budget: expected an int >= 0, got -1"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: expected an int >= 1"),
    (["--threshold", "1.5"], "argument --threshold: expected a number in (0, 1]"),
    (["--device", "nosuchdevice"], "argument --device"),
    (["--model", "{tmp}/missing"], "--model: '{tmp}/missing' is neither a checkpoint directory nor a preset"),
    (["--model", "{tmp}/a_file"], "--model: '{tmp}/a_file' is a file"),
    (["--draft-graph", "{tmp}/missing.json"], "--draft-graph: file '{tmp}/missing.json': cannot read"),
    (["--draft-graph", "{tmp}/not_json.json"], "not valid JSON"),
    (["--draft-graph", "{tmp}/deep.json"], "nested 50000 levels deep"),
    (["--draft-graph", "{tmp}/graph16.json"], "--draft-graph: block_size 16 does not fit the model's block size 32"),
])
@pytest.mark.parametrize("command", ["generate", "demo", "eval"])
def test_bad_decoding_argument(command, args, expected, bad_files, no_loading, capsys):
    argv = [command] + [a.replace("{tmp}", str(bad_files)) for a in args]
    if command == "generate":
        argv += ["--prompt", "1+1="]
    assert expected.replace("{tmp}", str(bad_files)) in _user_error(argv, capsys)


def test_bad_config_json_is_named_before_the_weights_load(tmp_path, no_loading, capsys):
    build("tiny-nld", seed=0).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["rms_norm_eps"] = -1
    (tmp_path / "config.json").write_text(json.dumps(raw))
    line = _user_error(["generate", "--prompt", "x", "--model", str(tmp_path)], capsys)
    assert line.endswith("--model: config.json: rms_norm_eps: expected a finite number > 0, got -1")


@pytest.mark.parametrize("argv,expected", [
    (["eval", "--tasks", "math,poetry"], "argument --tasks: expected a comma-separated subset"),
    (["eval", "--modes", ""], "argument --modes"),
    (["eval", "--limit", "0"], "argument --limit"),
    (["eval", "--draft-budgets", "4,-2"], "argument --draft-budgets"),
    (["sweep", "--taus", "0,-0.1"], "argument --taus"),
    (["sweep", "--fidelity-every", "0"], "argument --fidelity-every"),
    (["dump", "--out", "{tmp}/d", "--branches", "0"], "argument --branches"),
])
def test_bad_command_values(argv, expected, tmp_path, no_loading, capsys):
    assert expected in _user_error([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)


@pytest.mark.parametrize("argv,expected", [
    (["eval", "--out", "{tmp}/a_file/report.json"], "--out: '{tmp}/a_file' is a file, expected a directory"),
    (["eval", "--out", "{tmp}"], "--out: '{tmp}' is a directory, expected a file path"),
    (["sweep", "--out-dir", "{tmp}/a_file"], "--out-dir: '{tmp}/a_file' is a file, expected a directory"),
    (["dump", "--out", "{tmp}/a_file"], "--out: '{tmp}/a_file' is a file"),
    (["calibrate", "--out", "{tmp}/a_file/graph.json"], "--out: '{tmp}/a_file' is a file"),
    (["calibrate", "--out", "{tmp}/g.json", "--traces-out", "{tmp}"], "--traces-out: '{tmp}' is a directory"),
    (["train", "--out", "{tmp}/a_file"], "--out: '{tmp}/a_file' is a file"),
])
def test_unwritable_outputs_fail_before_any_work(argv, expected, bad_files, no_loading, capsys):
    argv = [a.replace("{tmp}", str(bad_files)) for a in argv]
    assert expected.replace("{tmp}", str(bad_files)) in _user_error(argv, capsys)


@pytest.mark.parametrize("argv,expected", [
    (["calibrate", "--prompts", "{tmp}/missing.txt"], "--prompts: cannot read '{tmp}/missing.txt' (No such file"),
    (["calibrate", "--prompts", "{tmp}"], "--prompts: '{tmp}' is a directory, expected a file"),
    (["calibrate", "--size", "0"], "argument --size: expected an int >= 1, got 0"),
    (["calibrate", "--num-prompts", "x"], "argument --num-prompts: expected an int, got 'x'"),
    (["calibrate", "--threshold", "2"], "argument --threshold: expected a number in (0, 1]"),
    (["calibrate", "--device", "nosuchdevice"], "argument --device"),
    (["calibrate", "--model", "{tmp}/missing"], "--model: '{tmp}/missing' is neither a checkpoint directory"),
    (["train", "--minutes", "-1"], "argument --minutes: expected a finite number > 0, got '-1'"),
    (["train", "--lr", "nan"], "argument --lr: expected a finite number > 0"),
    (["train", "--batch-size", "0"], "argument --batch-size: expected an int >= 1, got 0"),
    (["train", "--eval-n", "0"], "argument --eval-n: expected an int >= 1, got 0"),
    (["train", "--device", "nosuchdevice"], "argument --device"),
])
def test_delegated_commands_check_values_and_inputs_first(argv, expected, bad_files, no_loading, capsys):
    """calibrate and train keep their own parsers; specfold checks their values and inputs before handing
    over, so these errors are one line and status 2 too."""
    out = ["--out", "{tmp}/graph.json"] if argv[0] == "calibrate" else ["--out", "{tmp}/ckpt"]
    argv = [a.replace("{tmp}", str(bad_files)) for a in argv + out]
    assert expected.replace("{tmp}", str(bad_files)) in _user_error(argv, capsys)


def test_missing_output_directory_is_created_first(tmp_path, monkeypatch, no_loading, capsys):
    """calibrate --out into a directory that does not exist yet: created before the traces are recorded
    (the write at the end cannot fail on it)."""
    out = tmp_path / "new" / "deeper" / "graph.json"
    with pytest.raises(AssertionError, match="loaded before"):  # past the checks: the (refused) load
        main(["calibrate", "--out", str(out)])
    assert out.parent.is_dir()


def test_unwritable_directory(tmp_path, monkeypatch, no_loading, capsys):
    """A directory that exists but refuses new files (permissions, a read-only filesystem)."""
    import tempfile

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    line = _user_error(["eval", "--out", str(tmp_path / "r.json")], capsys)
    assert line.endswith(f"--out: cannot write in '{tmp_path}' (Permission denied)")


def test_sweep_needs_matplotlib_up_front_unless_no_plot(tmp_path, monkeypatch, no_loading, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    line = _user_error(["sweep", "--out-dir", str(tmp_path)], capsys)
    assert "sweep.png needs matplotlib (pip install 'specfold-compile[plot]'), or pass --no-plot" in line
    ran = []
    monkeypatch.setattr(eval_commands, "run_sweep", lambda a: ran.append(a.no_plot) or 0)
    assert main(["sweep", "--out-dir", str(tmp_path), "--no-plot"]) == 0 and ran == [True]


@pytest.mark.parametrize("argv", [["eval"], ["sweep", "--no-plot"], ["dump", "--out", "{tmp}/d"]])
def test_triton_kernels_need_triton_up_front(argv, tmp_path, monkeypatch, no_loading, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    line = _user_error([a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--kernels", "triton"], capsys)
    assert line.endswith("--kernels triton needs triton (pip install 'specfold-compile[triton]'), or pass "
                         "--kernels torch")


def test_sweep_writes_its_measurements_before_the_plot(tmp_path, monkeypatch):
    """A plot that fails (matplotlib broken, a full disk) loses no measurement."""
    row = {"tau": 0.0, "accuracy_math": 1.0, "tokens_per_s": 1.0, "recompute_ratio": 1.0, "nfe": 2.0,
           "accepted_per_call": 0.0, "n_per_task": 1, **{k: 1.0 for k in SWEEP_FIDELITY_COLUMNS}}
    rep = {"rows": [row], "spiffy_accuracy": {"math": 1.0}, "warmup_seconds": {}, "fidelity_calls": {}}
    monkeypatch.setattr(eval_commands, "load_model", lambda *a, **k: build("tiny-fast-dllm-v2"))
    monkeypatch.setattr(eval_commands, "sweep", lambda *a, **k: rep)

    def broken(*args):
        raise RuntimeError("plotting failed")

    monkeypatch.setattr(eval_commands, "plot_sweep", broken)
    with pytest.raises(RuntimeError, match="plotting failed"):
        main(["sweep", "--tasks", "math", "--taus", "0", "--out-dir", str(tmp_path), "--model", "tiny-fast-dllm-v2"])
    assert json.loads((tmp_path / "sweep.json").read_text())["rows"][0]["tau"] == 0.0
    assert (tmp_path / "sweep.csv").read_text().startswith("tau,")


def test_library_value_error_during_the_run_is_one_line(tmp_path, capsys):
    """A ValueError the library raises mid-run (here: the model's position limit) ends the command with
    one line and status 2, compiled (torch.compile wraps errors) or not; SPECFOLD_TRACEBACK=1 keeps it."""
    build("tiny-nld", seed=0, max_position_embeddings=40).save_pretrained(tmp_path)
    for mode in ("vanilla", "specfold"):
        line = _user_error(["generate", "--prompt", "12+30=", "--model", str(tmp_path), "--mode", mode,
                            "--max-new-tokens", "64"], capsys)
        assert "max_position_embeddings" in line or "max_new_tokens" in line, line
    os.environ["SPECFOLD_TRACEBACK"] = "1"
    try:
        with pytest.raises(ValueError):
            main(["generate", "--prompt", "12+30=", "--model", str(tmp_path), "--mode", "vanilla",
                  "--max-new-tokens", "64"])
    finally:
        del os.environ["SPECFOLD_TRACEBACK"]


def test_entry_point_prints_one_line_and_exits_2(tmp_path):
    """The real command (a fresh interpreter): no traceback, one line, status 2."""
    env = dict(os.environ, PYTHONPATH=REPO)
    res = subprocess.run([sys.executable, "-m", "specfold_compile.cli", "generate", "--prompt", "x",
                          "--draft-graph", str(tmp_path / "missing.json")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"specfold generate: error: --draft-graph: file '{tmp_path / 'missing.json'}': cannot read "
        f"(No such file or directory)"]
