"""``specfold generate --prompts-file``: many prompts through the serving engine, one JSON line each, every
prompt's text, tokens and forwards those of ``specfold generate --prompt`` on it alone; bad files and
options refused in one line before anything loads."""
import json

import pytest

from specfold_compile import loading
from specfold_compile.cli import generate, main

PROMPTS = ["3+4=", "12+30=", "def add(a, b):"]


def _single(prompt: str, mode: str, capsys) -> tuple[str, int, int]:
    assert main(["generate", "--prompt", prompt, "--max-new-tokens", "32", "--mode", mode]) == 0
    out = capsys.readouterr().out
    text, stats = out.rsplit("\nmode=", 1)
    fields = dict(f.split("=", 1) for f in stats.split() if "=" in f)
    return text[:-1], int(fields["tokens"]), int(fields["nfe"])  # print() added the newline before the stats


@pytest.mark.parametrize("mode, slots, tau", [("vanilla", None, None), ("spiffy", 2, None), ("specfold", 1, "0"),
                                             ("specfold", None, "0.1")])
def test_each_prompt_decodes_as_alone(mode, slots, tau, tmp_path, capsys):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": PROMPTS[0], "id": "a"}) + "\n\n" + json.dumps(PROMPTS[1]) + "\n"
                    + json.dumps({"prompt": PROMPTS[2]}) + "\n")
    argv = ["generate", "--prompts-file", str(path), "--max-new-tokens", "32", "--mode", mode]
    argv += ([] if slots is None else ["--max-requests", str(slots)]) + ([] if tau is None else ["--tau", tau])
    assert main(argv) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [line["index"] for line in lines] == [0, 1, 2]
    assert f"mode={mode} requests=3 slots={slots or 3} tokens={sum(line['tokens'] for line in lines)}" \
        in captured.err
    for line, prompt in zip(lines, PROMPTS):
        # SpecFold at tau 0 folds only exact repeats: Spiffy's tokens and forwards. At tau > 0 the engine's
        # folded forward and the backend's may decide a fold within rounding of tau apart (docs/serving.md)
        if mode == "specfold" and tau != "0":
            assert line["tokens"] > 0 and line["nfe"] >= line["blocks"] >= 1
            continue
        alone = _single(prompt, "spiffy" if mode == "specfold" else mode, capsys)
        assert (line["text"], line["tokens"], line["nfe"]) == alone


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")
    for module in (loading, generate):
        monkeypatch.setattr(module, "load_model", refuse)


@pytest.mark.parametrize("content, extra, expected", [
    ('{"prompt": "a"}\n{"prompt": 3}\n', [], 'line 2: expected a JSON string or an object with a "prompt" string'),
    ('"a"\nnot json\n', [], "line 2: expected JSON"),
    ("\n\n", [], "holds no prompt"),
    ('"a"\n', ["--fuse-boundaries"], "--fuse-boundaries: not with --prompts-file"),
    ('"a"\n', ["--compile-writes", "--mode", "specfold"], "--compile-writes: not with --prompts-file"),
    ('"a"\n', ["--max-requests", "0"], "--max-requests"),
])
def test_bad_batches_fail_in_one_line_first(content, extra, expected, tmp_path, no_loading, capsys):
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--prompts-file", str(path), *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "Traceback" not in err


def test_prompt_options_are_kept_apart(tmp_path, no_loading, capsys):
    for argv, expected in ((["--prompt", "a", "--max-requests", "2"], "--max-requests: only with --prompts-file"),
                           (["--prompt", "a", "--prompts-file", str(tmp_path / "x")], "not allowed with"),
                           ([], "one of the arguments --prompt --prompts-file is required"),
                           (["--prompts-file", str(tmp_path / "missing.jsonl")], "--prompts-file: cannot read")):
        with pytest.raises(SystemExit) as exc:
            main(["generate", *argv])
        assert exc.value.code == 2 and expected in capsys.readouterr().err
