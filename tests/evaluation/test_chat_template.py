"""The chat template: applied through transformers when the checkpoint's tokenizer has one, skipped with
--no-chat-template, and the shipped model's prompt format used where there is none."""
from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from specfold_compile import loading
from specfold_compile.cli import main
from specfold_compile.loading import DEFAULT_MODEL_DIR, encode, load_model, prompt_style

# Reproduces the shipped model's prompt format ("<|bos|>{prompt}<|sep|>") as a chat template.
SAME_AS_FORMAT = ("<|bos|>{% for m in messages %}{{ m['content'] }}{% endfor %}"
                  "{% if add_generation_prompt %}<|sep|>{% endif %}")
# Differs from it, so the tests can tell which one was applied.
QUESTION = ("<|bos|>{% for m in messages %}Q: {{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<|sep|>{% endif %}")


def _copy_with_template(tmp_path, template, keep_format=True):
    folder = tmp_path / "ckpt"
    shutil.copytree(DEFAULT_MODEL_DIR, folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    if not keep_format:
        (folder / "prompt_format.json").unlink()
    return folder


def _without_transformers(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))


def test_shipped_model_template_and_format_agree():
    """The shipped model prompts in its training format, through its chat template where it has one
    and through prompt_format.json otherwise (or with the template switched off): the same ids."""
    shipped, plain = load_model(None), load_model(None, chat_template=False)
    assert prompt_style(DEFAULT_MODEL_DIR, chat_template=False) == "prompt_format"
    expected = plain.tokenizer.encode("<|bos|>3+4=<|sep|>", add_special_tokens=False).ids
    assert encode(plain, "3+4=").tolist() == expected
    assert encode(shipped, "3+4=").tolist() == expected


def test_template_equal_to_the_format_gives_the_same_ids(tmp_path):
    """The shipped model with a chat template written for its format: both paths give the same prompt."""
    folder = _copy_with_template(tmp_path, SAME_AS_FORMAT)
    with_template = load_model(str(folder))
    assert prompt_style(folder) == "chat_template" and with_template.chat_tokenizer is not None
    plain = load_model(str(folder), chat_template=False)
    for text in ("3+4=", "Write a function that reverses a list."):
        assert encode(with_template, text).tolist() == encode(plain, text).tolist()


def test_the_tokenizers_own_template_is_applied(tmp_path):
    from transformers import AutoTokenizer

    folder = _copy_with_template(tmp_path, QUESTION)
    model = load_model(str(folder))
    expected = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        [{"role": "user", "content": "3+4="}], add_generation_prompt=True, tokenize=True, return_dict=False)
    assert encode(model, "3+4=").tolist() == list(expected)
    assert encode(model, "3+4=").tolist() == model.tokenizer.encode("<|bos|>Q: 3+4=<|sep|>",
                                                                    add_special_tokens=False).ids
    plain = load_model(str(folder), chat_template=False)  # --no-chat-template: the prompt format
    assert encode(plain, "3+4=").tolist() == model.tokenizer.encode("<|bos|>3+4=<|sep|>",
                                                                    add_special_tokens=False).ids


def test_generate_sends_the_templated_prompt(tmp_path, monkeypatch, capsys):
    """``specfold generate --model DIR`` decodes the chat-templated ids; --no-chat-template the format's."""
    import specfold_compile.decoding as decoding

    folder = _copy_with_template(tmp_path, QUESTION)
    seen = []
    real = decoding.generate

    def spy(model, ids, **kw):
        seen.append(ids.tolist())
        return real(model, ids, **{**kw, "max_new_tokens": 2})

    monkeypatch.setattr(decoding, "generate", spy)
    tok = load_model(str(folder), chat_template=False).tokenizer
    for flags, text in (([], "<|bos|>Q: 3+4=<|sep|>"), (["--no-chat-template"], "<|bos|>3+4=<|sep|>")):
        assert main(["generate", "--model", str(folder), "--prompt", "3+4=", "--mode", "vanilla", *flags]) == 0
        assert seen[-1] == tok.encode(text, add_special_tokens=False).ids
    capsys.readouterr()


def test_without_transformers(tmp_path, monkeypatch, capsys):
    """No transformers: a checkpoint with a prompt format falls back to it; one without stops before
    loading, naming what to install and --no-chat-template."""
    _without_transformers(monkeypatch)
    with_format = _copy_with_template(tmp_path / "a", QUESTION)
    assert prompt_style(with_format) == "prompt_format"
    model = load_model(str(with_format))
    assert model.chat_tokenizer is None and encode(model, "1").tolist() == model.tokenizer.encode(
        "<|bos|>1<|sep|>", add_special_tokens=False).ids
    bare = _copy_with_template(tmp_path / "b", QUESTION, keep_format=False)

    def refuse(*args, **kwargs):
        raise AssertionError("loaded before the check")

    monkeypatch.setattr(loading.models, "from_pretrained", refuse)
    with pytest.raises(SystemExit) as err:
        main(["generate", "--model", str(bare), "--prompt", "1"])
    assert err.value.code == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("specfold generate: error: --model: chat template:") and "specfold-compile[hf]" in line
    assert "--no-chat-template" in line and "\n" not in line
    assert prompt_style(bare, chat_template=False) == "raw"
