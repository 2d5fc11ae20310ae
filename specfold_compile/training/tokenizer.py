"""A small byte-level BPE tokenizer trained on a generated corpus of the three tasks.

Byte-level (every byte is in the base alphabet, no normalizer) so decode(encode(text)) == text exactly,
whitespace and newlines included; digits are split one per token so arithmetic stays learnable.
Special tokens: <|mask|>, <|eos|>, <|bos|>, <|pad|>, <|sep|> (ids 0..4).

``save_tokenizer`` writes ``tokenizer.json`` and a transformers-compatible ``tokenizer_config.json`` whose
``chat_template`` is the prompt format (``tasks.format_prompt``): ``AutoTokenizer.from_pretrained(DIR)
.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)`` gives
``<|bos|>{p}<|sep|>``.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ..tasks import BOS, EOS, MASK, PAD, SEP, SPECIAL_TOKENS, TASKS, format_prompt, sample


def special_ids(tok: Tokenizer) -> dict[str, int]:
    ids = {name: tok.token_to_id(t) for name, t in
           (("mask_token_id", MASK), ("eos_token_id", EOS), ("bos_token_id", BOS), ("pad_token_id", PAD),
            ("sep_token_id", SEP))}
    missing = [k for k, v in ids.items() if v is None]
    if missing:
        raise ValueError(f"tokenizer: missing special tokens {missing}")
    return ids


def corpus(n_per_task: int = 4000, seed: int = 0) -> list[str]:
    texts = []
    for task in TASKS:
        for p in sample(task, "train", n_per_task, seed):
            texts.append(p.prompt)
            texts.append(p.reference)
    return texts


def build_tokenizer(vocab_size: int = 1024, n_per_task: int = 4000, seed: int = 0) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(n_per_task, seed), trainer=trainer)
    special_ids(tok)
    return tok


def encode_prompt(tok: Tokenizer, prompt: str) -> list[int]:
    return tok.encode(format_prompt(prompt), add_special_tokens=False).ids


def encode_response(tok: Tokenizer, response: str) -> list[int]:
    return tok.encode(response, add_special_tokens=False).ids


def decode_response(tok: Tokenizer, ids: list[int], eos_id: int) -> str:
    """Text of generated ids up to (not including) the first eos; other special tokens are dropped."""
    if eos_id in ids:
        ids = ids[:ids.index(eos_id)]
    return tok.decode(ids, skip_special_tokens=True)


# <|bos|>, then each user turn followed by <|sep|> (the point where the model starts its response) and each
# assistant turn followed by <|eos|>; the model was trained on one user turn. A user turn always ends with
# <|sep|>, so add_generation_prompt adds nothing more.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{- message['content'] + '" + SEP + "' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- message['content'] + eos_token -}}"
    "{%- else -%}{{- raise_exception('only user and assistant messages are supported') -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


def tokenizer_config(tok: Tokenizer, model_max_length: int) -> dict:
    """The ``tokenizer_config.json`` of ``tok`` for ``transformers.AutoTokenizer`` (the fast tokenizer
    reads ``tokenizer.json`` next to it)."""
    special_ids(tok)  # all special tokens present
    return {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
            "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "mask_token": MASK, "sep_token": SEP,
            "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
            "model_max_length": model_max_length}


def save_tokenizer(tok: Tokenizer, out: str | Path, model_max_length: int) -> None:
    """``tokenizer.json`` and ``tokenizer_config.json`` in ``out``."""
    out = Path(out)
    tok.save(str(out / "tokenizer.json"))
    write_tokenizer_config(tok, out, model_max_length)


def write_tokenizer_config(tok: Tokenizer, out: str | Path, model_max_length: int) -> None:
    (Path(out) / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(tok, model_max_length), indent=2) + "\n")
