"""A checkpoint's prompt format (``prompt_format.json``), applied by the tokenizer ``from_pretrained`` attaches.

Our trained checkpoints answer a prompt written as ``"<|bos|>{prompt}<|sep|>"`` (the training layout,
``tasks.format_prompt``), recorded in the checkpoint's ``prompt_format.json``. ``from_pretrained`` sets
the template as the tokenizer's post-processor (``tokenizers.processors.TemplateProcessing``), so the
tokenizer's ordinary call, ``model.tokenizer.encode(text).ids`` (``add_special_tokens=True``, its
default), gives the ids the model was trained on; ``add_special_tokens=False`` encodes the text alone, and
``decode(ids, skip_special_tokens=True)`` drops the format's tokens again. The post-processor adds the
format's tokens around the text's own, which equals encoding the formatted text only when the fixed
parts are special tokens (the tokenizer never merges across them): a template with other text around
``{prompt}`` is kept as ``model.prompt_format`` without a post-processor (format the text with it, as
``loading.encode`` does).
"""

from __future__ import annotations

from pathlib import Path

from .. import json_input

__all__ = ["PROMPT_FORMAT_FILE", "read_prompt_format", "prompt_post_processor", "apply_prompt_format"]

PROMPT_FORMAT_FILE = "prompt_format.json"
_SLOT = "{prompt}"


def read_prompt_format(folder: str | Path) -> str | None:
    """The prompt template of the checkpoint in ``folder`` (e.g. ``"<|bos|>{prompt}<|sep|>"``), or None
    when it has no ``prompt_format.json``."""
    file = Path(folder) / PROMPT_FORMAT_FILE
    if not file.is_file():
        return None
    data = json_input.load_file(file, f"{PROMPT_FORMAT_FILE}: file")
    template = data.get("prompt") if isinstance(data, dict) else None
    if not isinstance(template, str) or template.count(_SLOT) != 1:
        raise ValueError(f"{PROMPT_FORMAT_FILE}: 'prompt' must be a string containing {_SLOT} once, got {template!r}")
    return template


def _special_pieces(tokenizer, text: str) -> list[tuple[str, int]] | None:
    """``text`` as (token, id) pairs when it is a run of the tokenizer's special tokens, else None."""
    if not text:
        return []
    encoding = tokenizer.encode(text, add_special_tokens=False)
    special = {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    if "".join(encoding.tokens) != text or not all(i in special for i in encoding.ids):
        return None
    return list(zip(encoding.tokens, encoding.ids))


def prompt_post_processor(tokenizer, template: str):
    """A ``TemplateProcessing`` that writes ``template``'s fixed parts around an encoded text, or None
    when they are not runs of special tokens (module docstring)."""
    from tokenizers.processors import TemplateProcessing  # noqa: PLC0415

    before, after = template.split(_SLOT)
    head, tail = _special_pieces(tokenizer, before), _special_pieces(tokenizer, after)
    if head is None or tail is None:
        return None
    single = [token for token, _ in head] + ["$A"] + [token for token, _ in tail]
    return TemplateProcessing(single=single, special_tokens=sorted(set(head + tail)))


def apply_prompt_format(tokenizer, template: str | None) -> bool:
    """Set ``template`` as ``tokenizer``'s post-processor where it can be (``prompt_post_processor``);
    returns whether it was set."""
    processor = None if template is None else prompt_post_processor(tokenizer, template)
    if processor is None:
        return False
    tokenizer.post_processor = processor
    return True
