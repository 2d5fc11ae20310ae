"""The task tokenizer: exact round trips, and the prompt format carried as a transformers chat template
(``tokenizer_config.json``), for a freshly trained tokenizer and for the shipped model's."""

import json
from pathlib import Path

import pytest

from specfold_compile.tasks import SPECIAL_TOKENS, TASKS, format_prompt, sample
from specfold_compile.training.tokenizer import (build_tokenizer, decode_response, encode_prompt, encode_response,
                                                 save_tokenizer, special_ids)

SHIPPED = Path(__file__).resolve().parents[2] / "specfold_compile" / "assets" / "specfold-tiny"
PROMPTS = ["Write 3 words about cats in lowercase, separated by ', '.", "What is 2 + 3?",
           "Write a function f(s) that returns s reversed.\n  (keep 'quotes' and {braces})"]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(1024, n_per_task=500)


def test_tokenizer_round_trip(tok):
    ids = special_ids(tok)
    assert tok.get_vocab_size() <= 1024
    for task in TASKS:
        for p in sample(task, "test", 100, seed=5):
            r = encode_response(tok, p.reference)
            assert decode_response(tok, r + [ids["eos_token_id"]] * 3, ids["eos_token_id"]) == p.reference
            assert all(t not in ids.values() for t in r)
            pr = encode_prompt(tok, p.prompt)
            assert pr[0] == ids["bos_token_id"] and pr[-1] == ids["sep_token_id"]
            assert tok.decode(pr[1:-1]) == p.prompt
    tricky = "def f(s):\n    return s[::-1]\n\n\t  x  = 1 | 2\n"
    assert tok.decode(tok.encode(tricky, add_special_tokens=False).ids) == tricky


def _check_chat_template(folder, tok):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    ids = special_ids(tok)
    for prompt in PROMPTS:
        msgs = [{"role": "user", "content": prompt}]
        text = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert text == format_prompt(prompt)
        # the same ids as the training / decoding path
        assert hf(text, add_special_tokens=False)["input_ids"] == encode_prompt(tok, prompt)
    assert (hf.mask_token_id, hf.eos_token_id, hf.bos_token_id, hf.pad_token_id, hf.sep_token_id) == (
        ids["mask_token_id"], ids["eos_token_id"], ids["bos_token_id"], ids["pad_token_id"], ids["sep_token_id"])
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert hf.apply_chat_template(turns, tokenize=False, add_generation_prompt=True) == \
        "<|bos|>a<|sep|>b<|eos|>c<|sep|>"
    with pytest.raises(Exception, match="only user and assistant"):
        hf.apply_chat_template([{"role": "system", "content": "x"}], tokenize=False)
    assert hf.decode(encode_prompt(tok, PROMPTS[2])[1:-1]) == PROMPTS[2]


def test_saved_tokenizer_carries_the_prompt_format(tok, tmp_path):
    save_tokenizer(tok, tmp_path, 4096)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and cfg["model_max_length"] == 4096
    assert {cfg[k] for k in ("bos_token", "eos_token", "pad_token", "mask_token", "sep_token")} == set(SPECIAL_TOKENS)
    _check_chat_template(tmp_path, tok)


def test_shipped_tokenizer_carries_the_prompt_format():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))
    _check_chat_template(SHIPPED, tok)
    fmt = json.loads((SHIPPED / "prompt_format.json").read_text())
    assert format_prompt("{prompt}") == fmt["prompt"]
