"""Hugging Face checkpoint directories: config.json + safetensors (single file or sharded with an index)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .. import json_input
from .config import ModelConfig
from .config_json import from_hf_dict, to_hf_dict

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def save_checkpoint(model: torch.nn.Module, path: str | os.PathLike, max_shard_bytes: int | None = None) -> None:
    """Write config.json and the weights under the family's parameter names (sharded past max_shard_bytes)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(to_hf_dict(model.config), indent=2) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if max_shard_bytes is None or sum(t.numel() * t.element_size() for t in state.values()) <= max_shard_bytes:
        save_file(state, str(path / SINGLE_FILE), metadata={"format": "pt"})
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
             "weight_map": weight_map}
    (path / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def read_config(path: str | os.PathLike, **overrides: Any) -> ModelConfig:
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"path: no config.json in {path}")
    return from_hf_dict(json_input.load_file(cfg_file, "config.json: file"), **overrides)


def _weight_files(path: Path) -> list[Path]:
    if (path / INDEX_FILE).is_file():
        index = json_input.load_file(path / INDEX_FILE, f"{INDEX_FILE}: file")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ValueError(f"{INDEX_FILE}: expected an object with a 'weight_map' of tensor -> file names")
        files = [path / f for f in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"checkpoint: shard(s) {missing} listed in {INDEX_FILE} are missing from {path}")
        return files
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE]
    found = sorted(path.glob("*.safetensors"))
    if not found:
        raise FileNotFoundError(f"path: no safetensors weights in {path}")
    return found


def _open_weights(file: Path):
    try:
        return safe_open(str(file), framework="pt")
    except (SafetensorError, OSError) as e:  # a truncated or foreign file
        raise ValueError(f"checkpoint: cannot read {file.name} as safetensors ({e})") from None


def load_weights(model: torch.nn.Module, path: str | os.PathLike) -> None:
    """Copy the checkpoint's tensors into ``model``; missing, unexpected or mis-shaped tensors are errors
    naming the tensor."""
    path = Path(path)
    expected = model.state_dict()
    tied_head = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    seen: set[str] = set()
    with torch.no_grad():
        for file in _weight_files(path):
            with _open_weights(file) as f:
                for name in f.keys():
                    if name in tied_head:
                        continue  # some tied checkpoints store the head too; the embedding is the truth
                    if name not in expected:
                        raise ValueError(f"checkpoint: unexpected tensor {name!r} in {file.name}")
                    t = f.get_tensor(name)
                    if tuple(t.shape) != tuple(expected[name].shape):
                        raise ValueError(f"checkpoint: tensor {name!r} has shape {tuple(t.shape)}, "
                                         f"the config expects {tuple(expected[name].shape)}")
                    expected[name].copy_(t.to(expected[name].dtype))
                    seen.add(name)
    missing = sorted(set(expected) - seen)
    if missing:
        raise ValueError(f"checkpoint: missing tensor(s) {missing[:5]}{' ...' if len(missing) > 5 else ''}")
