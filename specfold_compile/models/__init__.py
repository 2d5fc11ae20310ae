"""Models: Fast-dLLM v2 and Nemotron-Labs-Diffusion, random presets, checkpoints, transformers wrappers.

``build(name, **overrides)`` makes a seeded random model of a preset; ``from_pretrained(path)`` loads a
local checkpoint directory; ``from_hf(hf_model)`` wraps a transformers Qwen2/Llama/Mistral causal LM.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .cache import PrefixCache
from .checkpoint import load_weights, read_config, save_checkpoint
from .config import FAST_DLLM_V2, NLD, PRESETS, ModelConfig, preset
from .fast_dllm_v2 import FastDLLMv2
from .layers import init_weights
from .nld import NemotronLabsDiffusion
from .prompting import apply_prompt_format, read_prompt_format
from .protocol import DecodingModel, StaticCacheModel, VerifyForward
from .transformer import BlockDiffusionLM

__all__ = ["build", "from_config", "from_pretrained", "from_hf", "PRESETS", "ModelConfig", "PrefixCache",
           "BlockDiffusionLM", "FastDLLMv2", "NemotronLabsDiffusion", "DecodingModel", "StaticCacheModel",
           "VerifyForward"]

_CLASSES = {FAST_DLLM_V2: FastDLLMv2, NLD: NemotronLabsDiffusion}


def from_config(config: ModelConfig, device: str | torch.device | None = None, seed: int | None = 0,
                fuse_projections: bool = True) -> BlockDiffusionLM:
    """Instantiate a model; weights are seeded random (skipped on the meta device or with seed=None).

    ``fuse_projections`` (default): q/k/v and gate/up as one GEMM each (``model.fuse_projections()``: two
    launches a layer instead of five); the seeded weights and the state_dict names are the same either
    way. ``False`` keeps the part modules (``self_attn.q_proj``, ...)."""
    device = torch.device(device or "cpu")
    with torch.device(device):
        model = _CLASSES[config.family](config)
    model.to(dtype=config.dtype)
    if device.type != "meta" and seed is not None:
        init_weights(model, config.initializer_range, torch.Generator(device=device).manual_seed(seed))
    if fuse_projections:
        model.fuse_projections()
    model.eval()
    model.requires_grad_(False)
    return model


def build(name: str, *, device: str | torch.device | None = None, seed: int = 0, fuse_projections: bool = True,
          **overrides: Any) -> BlockDiffusionLM:
    """A seeded random model of preset ``name`` (see ``PRESETS``); any config field can be overridden,
    e.g. ``build("nld-3b", num_layers=2, dtype=torch.bfloat16, device="cuda")``. ``fuse_projections``:
    see ``from_config``."""
    return from_config(preset(name, **overrides), device=device, seed=seed, fuse_projections=fuse_projections)


def from_pretrained(path: str | os.PathLike, *, device: str | torch.device | None = None,
                    dtype: torch.dtype | None = None, fuse_projections: bool = True) -> BlockDiffusionLM:
    """Load a local checkpoint directory (config.json + safetensors, sharded or not). The tokenizer, when
    ``tokenizer.json`` is present, is attached as ``model.tokenizer`` (a ``tokenizers.Tokenizer``), and the
    checkpoint's prompt format (``prompt_format.json``, our trained checkpoints' ``"<|bos|>{prompt}<|sep|>"``)
    as ``model.prompt_format`` (None without one). The tokenizer applies the format itself:
    ``model.tokenizer.encode(text).ids`` are the ids of the formatted prompt, what the model was trained to
    answer; ``encode(text, add_special_tokens=False)`` the text's alone (``models.prompting``)."""
    path = Path(path)
    config = read_config(path, **({"dtype": dtype} if dtype is not None else {}))
    model = from_config(config, device="cpu", seed=None, fuse_projections=False)
    load_weights(model, path)
    if fuse_projections:  # after loading: the checkpoint's tensors are the parts', fused by one cat each
        model.fuse_projections()
    model.tokenizer = None
    model.prompt_format = read_prompt_format(path)
    if (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        model.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        apply_prompt_format(model.tokenizer, model.prompt_format)
    model.name_or_path = str(path)
    return model.to(device or "cpu")


def save_pretrained(model: BlockDiffusionLM, path: str | os.PathLike, max_shard_bytes: int | None = None) -> None:
    save_checkpoint(model, path, max_shard_bytes)


BlockDiffusionLM.save_pretrained = save_pretrained  # model.save_pretrained(path[, max_shard_bytes])


def from_hf(hf_model: torch.nn.Module, **kwargs: Any) -> BlockDiffusionLM:
    from .hf import from_hf as _from_hf

    return _from_hf(hf_model, **kwargs)
