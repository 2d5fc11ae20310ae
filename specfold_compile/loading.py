"""Turning a user's ``--model`` into a model, and text into token ids."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

from . import json_input, models
from .models.prompting import PROMPT_FORMAT_FILE

# The shipped trained model; used when no model is given.
DEFAULT_MODEL_DIR = Path(__file__).parent / "assets" / "specfold-tiny"


def default_model_available() -> bool:
    return (DEFAULT_MODEL_DIR / "config.json").is_file()


def load_model(spec: str | None = None, *, device: str = "cpu", seed: int = 0, dtype: torch.dtype | None = None,
               chat_template: bool = True):
    """A checkpoint directory, a preset name (random weights, seeded), or None for the shipped model
    (falling back to the ``tiny-fast-dllm-v2`` preset when no trained model is shipped).

    ``chat_template``: when the checkpoint's tokenizer has a chat template, ``encode`` applies it (see
    ``prompt_style``); False: the prompt format of our trained checkpoints, else the raw text."""
    if spec is None or spec == "default":
        if default_model_available():
            return _from_dir(DEFAULT_MODEL_DIR, device, dtype, chat_template)
        spec = "tiny-fast-dllm-v2"
    if os.path.isdir(spec):
        return _from_dir(Path(spec), device, dtype, chat_template)
    if spec in models.PRESETS:
        overrides = {"dtype": dtype} if dtype is not None else {}
        return models.build(spec, device=device, seed=seed, **overrides)
    raise ValueError(f"model: {spec!r} is neither a checkpoint directory nor a preset; presets: {sorted(models.PRESETS)}")


def model_folder(spec: str | None) -> Path | None:
    """The checkpoint directory behind a ``--model`` value (None for presets)."""
    if spec in (None, "default"):
        return DEFAULT_MODEL_DIR if default_model_available() else None
    return Path(spec) if os.path.isdir(spec) else None


def has_chat_template(folder: Path) -> bool:
    """The tokenizer saved in ``folder`` carries a chat template (tokenizer_config.json's
    ``chat_template``, or transformers' separate chat_template.jinja / chat_template.json)."""
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    cfg = folder / "tokenizer_config.json"
    if not cfg.is_file():
        return False
    data = json_input.load_file(cfg, "tokenizer_config.json: file")
    return isinstance(data, dict) and bool(data.get("chat_template"))


def prompt_style(folder: Path | None, chat_template: bool = True) -> str:
    """How ``encode`` turns text into the prompt: ``"chat_template"`` (the tokenizer's own, through
    transformers' ``apply_chat_template(..., add_generation_prompt=True)``), ``"prompt_format"`` (the
    ``prompt_format.json`` template of our trained checkpoints, used when the chat template is switched
    off or transformers is not installed) or ``"raw"``. A chat template that cannot be applied and has
    no prompt format to fall back on is a ValueError naming what to install."""
    if folder is None:
        return "raw"
    has_format = (folder / PROMPT_FORMAT_FILE).is_file()
    if chat_template and has_chat_template(folder):
        if importlib.util.find_spec("transformers") is not None:
            return "chat_template"
        if not has_format:
            raise ValueError(f"chat template: the tokenizer in {str(folder)!r} has one; applying it needs "
                             f"transformers (pip install 'specfold-compile[hf]'), or pass --no-chat-template")
    return "prompt_format" if has_format else "raw"


def resolve_draft_graph(model_spec: str | None, draft_graph: str | None) -> str | None:
    """The Spiffy draft graph to use: the given one; else the ``draft_graph.json`` calibrated for the
    checkpoint (the shipped model has one); else None (decoding's built-in default graph)."""
    if draft_graph is not None:
        return draft_graph
    folder = model_folder(model_spec)
    if folder is not None and (folder / "draft_graph.json").is_file():
        return str(folder / "draft_graph.json")
    return None


def _from_dir(path: Path, device: str, dtype: torch.dtype | None, chat_template: bool = True):
    style = prompt_style(path, chat_template)  # first: a template that cannot be applied fails before loading
    model = models.from_pretrained(path, device=device, dtype=dtype)
    if style != "prompt_format":  # encode applies the chat template, or the raw text
        model.prompt_format = None
    model.chat_tokenizer = _chat_tokenizer(path) if style == "chat_template" else None
    return model


def _chat_tokenizer(path: Path):
    """transformers' tokenizer of ``path``, for its ``apply_chat_template``."""
    from transformers import AutoTokenizer  # noqa: PLC0415
    from transformers.utils import logging as hf_logging  # noqa: PLC0415

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # it remarks that our config.json's model type is not one of its own
    try:
        return AutoTokenizer.from_pretrained(str(path))
    finally:
        hf_logging.set_verbosity(verbosity)


def encode(model, text: str) -> torch.Tensor:
    """Token ids of ``text``: the chat template applied by the checkpoint's tokenizer (``load_model``'s
    ``chat_template``), else its prompt format or the raw text through the tokenizer; without a tokenizer
    (random presets), UTF-8 bytes folded into the vocabulary, avoiding the mask and eos ids."""
    chat = getattr(model, "chat_tokenizer", None)
    if chat is not None:
        return torch.tensor(chat.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                     tokenize=True, return_dict=False), dtype=torch.int64)
    tok = getattr(model, "tokenizer", None)
    if tok is not None:
        template = getattr(model, "prompt_format", None)
        text = template.format(prompt=text) if template else text
        return torch.tensor(tok.encode(text, add_special_tokens=False).ids, dtype=torch.int64)
    cfg = model.config
    special = {cfg.mask_token_id, cfg.eos_token_id}
    ids = [b % cfg.vocab_size for b in text.encode()]
    return torch.tensor([i if i not in special else (i + 2) % cfg.vocab_size for i in ids] or [0], dtype=torch.int64)


def decode(model, ids: list[int]) -> str:
    tok = getattr(model, "tokenizer", None)
    if tok is not None:
        eos = model.config.eos_token_id
        return tok.decode(ids[: ids.index(eos)] if eos in ids else ids, skip_special_tokens=True)
    return " ".join(map(str, ids))
