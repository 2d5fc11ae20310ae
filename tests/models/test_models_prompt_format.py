"""The documented loader's tokenizer applies the shipped model's prompt format: ``from_pretrained(DIR)
.tokenizer.encode(text)`` gives the ids of the training layout's prompt (``<|bos|>{prompt}<|sep|>``), the
same as transformers' chat template and the command line's ``loading.encode``; templates whose fixed
parts are not special tokens are left to ``model.prompt_format``."""

import json
import shutil

import pytest

from specfold_compile.loading import DEFAULT_MODEL_DIR, encode, load_model
from specfold_compile.models import from_pretrained
from specfold_compile.models.prompting import apply_prompt_format, read_prompt_format
from specfold_compile.tasks import TASKS, format_prompt, sample
from specfold_compile.training.tokenizer import encode_prompt

PLAIN = ["What is 2 + 3?", "Write a function f(s) that returns s reversed.\n  (keep 'quotes' and {braces})",
         "", "<|sep|> inside", "  two spaces first"]


@pytest.fixture(scope="module")
def shipped():
    return from_pretrained(DEFAULT_MODEL_DIR)


def _prompts():
    return PLAIN + [p.prompt for task in TASKS for p in sample(task, "test", 5, seed=3)]


def test_the_documented_tokenizer_gives_the_training_layouts_ids(shipped):
    tok = shipped.tokenizer
    assert shipped.prompt_format == "<|bos|>{prompt}<|sep|>" == format_prompt("{prompt}")
    for text in _prompts():
        ids = tok.encode(text).ids
        assert ids == encode_prompt(tok, text)  # what training fed the model
        assert ids == tok.encode(format_prompt(text), add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=True) == text.replace("<|sep|>", "")
    assert tok.encode("3+4=", add_special_tokens=False).ids == encode_prompt(tok, "3+4=")[1:-1]


def test_chat_template_and_command_line_agree_with_it(shipped):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(DEFAULT_MODEL_DIR))
    cli_model = load_model(None)
    for text in _prompts()[:8]:
        chat = hf.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        assert list(chat) == shipped.tokenizer.encode(text).ids == encode(cli_model, text).tolist()


def _checkpoint_with_format(tmp_path, template):
    folder = tmp_path / "ckpt"
    shutil.copytree(DEFAULT_MODEL_DIR, folder)
    data = json.loads((folder / "prompt_format.json").read_text())
    (folder / "prompt_format.json").write_text(json.dumps({**data, "prompt": template}))
    return folder


def test_a_template_with_plain_text_is_not_a_post_processor(tmp_path):
    """Text around {prompt} would merge with the prompt's first tokens: the tokenizer leaves it alone,
    model.prompt_format keeps it for the caller (and loading.encode applies it)."""
    folder = _checkpoint_with_format(tmp_path, "<|bos|>Q: {prompt}<|sep|>")
    model = from_pretrained(folder)
    assert model.prompt_format == "<|bos|>Q: {prompt}<|sep|>"
    assert model.tokenizer.encode("3+4=").ids == model.tokenizer.encode("3+4=", add_special_tokens=False).ids
    expected = model.tokenizer.encode("<|bos|>Q: 3+4=<|sep|>", add_special_tokens=False).ids
    assert encode(load_model(str(folder), chat_template=False), "3+4=").tolist() == expected


def test_no_format_and_bad_formats(tmp_path, shipped):
    bare = tmp_path / "bare"
    shutil.copytree(DEFAULT_MODEL_DIR, bare)
    (bare / "prompt_format.json").unlink()
    model = from_pretrained(bare)
    assert model.prompt_format is None and read_prompt_format(bare) is None
    assert model.tokenizer.encode("3+4=").ids == shipped.tokenizer.encode("3+4=", add_special_tokens=False).ids
    assert not apply_prompt_format(model.tokenizer, None)
    for i, bad in enumerate(("no slot", "{prompt}{prompt}", 7)):
        folder = _checkpoint_with_format(tmp_path / str(i), bad)
        with pytest.raises(ValueError, match=r"^prompt_format.json: 'prompt' must be a string containing \{prompt\} "
                                             r"once, got") as err:
            from_pretrained(folder)
        assert "\n" not in str(err.value)
