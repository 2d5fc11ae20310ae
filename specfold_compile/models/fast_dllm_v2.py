"""Fast-dLLM v2 (arXiv 2509.26328): Qwen2.5 fine-tuned for block diffusion.

Qwen2 layer (q/k/v bias, RoPE, GQA, SwiGLU), tied or untied ``lm_head``, block 32, sub-block 8 and
shifted logits: position p of a block reads the distribution computed at p-1 (position 0 its own).
Checkpoint names: ``model.embed_tokens``, ``model.layers.N.self_attn.q_proj``, ..., ``model.norm``, ``lm_head``.
"""

from __future__ import annotations

from torch import Tensor, nn

from .config import FAST_DLLM_V2, ModelConfig
from .layers import Backbone, RotaryEmbedding
from .transformer import BlockDiffusionLM


class FastDLLMv2(BlockDiffusionLM):
    def __init__(self, config: ModelConfig):
        if config.family != FAST_DLLM_V2:
            raise ValueError(f"config.family: expected {FAST_DLLM_V2!r}, got {config.family!r}")
        super().__init__(config)
        self.model = Backbone(config)
        self.rotary = RotaryEmbedding(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def backbone(self) -> Backbone:
        return self.model

    def head(self, h: Tensor) -> Tensor:
        if self.config.tie_word_embeddings:
            return nn.functional.linear(h, self.model.embed_tokens.weight)
        return self.lm_head(h)
