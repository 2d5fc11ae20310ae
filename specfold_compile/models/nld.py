"""Nemotron-Labs-Diffusion: a Ministral-3 backbone denoised block by block.

No biases, YaRN RoPE, Llama-4 query scaling (identity below ``llama4_original_max_position``), an untied
``diffusion_head``, no logit shift, commits anywhere in the block. Checkpoint names:
``encoder.embed_tokens``, ``encoder.layers.N.self_attn.q_proj``, ..., ``encoder.norm``, ``diffusion_head``.
"""

from __future__ import annotations

from torch import Tensor, nn

from .config import NLD, ModelConfig
from .layers import Backbone, RotaryEmbedding
from .transformer import BlockDiffusionLM


class NemotronLabsDiffusion(BlockDiffusionLM):
    def __init__(self, config: ModelConfig):
        if config.family != NLD:
            raise ValueError(f"config.family: expected {NLD!r}, got {config.family!r}")
        super().__init__(config)
        self.encoder = Backbone(config)
        self.rotary = RotaryEmbedding(config)
        self.diffusion_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def backbone(self) -> Backbone:
        return self.encoder

    def head(self, h: Tensor) -> Tensor:
        return self.diffusion_head(h)
