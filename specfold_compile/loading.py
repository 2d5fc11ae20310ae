"""Turning a user's ``--model`` into a model, and text into token ids."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from . import models

# The shipped trained model (issue: small trained block-diffusion LM); used when no model is given.
DEFAULT_MODEL_DIR = Path(__file__).parent / "assets" / "specfold-tiny"


def default_model_available() -> bool:
    return (DEFAULT_MODEL_DIR / "config.json").is_file()


def load_model(spec: str | None = None, *, device: str = "cpu", seed: int = 0, dtype: torch.dtype | None = None):
    """A checkpoint directory, a preset name (random weights, seeded), or None for the shipped model
    (falling back to the ``tiny-fast-dllm-v2`` preset when no trained model is shipped)."""
    if spec is None or spec == "default":
        if default_model_available():
            return _from_dir(DEFAULT_MODEL_DIR, device, dtype)
        spec = "tiny-fast-dllm-v2"
    if os.path.isdir(spec):
        return _from_dir(Path(spec), device, dtype)
    if spec in models.PRESETS:
        overrides = {"dtype": dtype} if dtype is not None else {}
        return models.build(spec, device=device, seed=seed, **overrides)
    raise ValueError(f"model: {spec!r} is neither a checkpoint directory nor a preset; presets: {sorted(models.PRESETS)}")


def resolve_draft_graph(model_spec: str | None, draft_graph: str | None) -> str | None:
    """The Spiffy draft graph to use: the given one; else the ``draft_graph.json`` calibrated for the
    checkpoint (the shipped model has one); else None (decoding's built-in default graph)."""
    if draft_graph is not None:
        return draft_graph
    if model_spec in (None, "default"):
        folder = DEFAULT_MODEL_DIR if default_model_available() else None
    else:
        folder = Path(model_spec) if os.path.isdir(model_spec) else None
    if folder is not None and (folder / "draft_graph.json").is_file():
        return str(folder / "draft_graph.json")
    return None


def _from_dir(path: Path, device: str, dtype: torch.dtype | None):
    model = models.from_pretrained(path, device=device, dtype=dtype)
    fmt = path / "prompt_format.json"
    # Chat-style prompt template of our trained checkpoints ("<|bos|>{prompt}<|sep|>").
    model.prompt_format = json.loads(fmt.read_text())["prompt"] if fmt.is_file() else None
    return model


def encode(model, text: str) -> torch.Tensor:
    """Token ids of ``text`` with the model's tokenizer; without one (random presets), UTF-8 bytes folded
    into the vocabulary, avoiding the mask and eos ids."""
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
