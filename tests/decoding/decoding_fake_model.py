"""A small deterministic fake block-diffusion model for decoding tests.

Logits of a row depend only on the cache's tokens and on that row's own tokens (rows independent), so
multi-row verification is exact. Context-dependent base logits keep argmax mostly stable across steps
(drafts sometimes match); a row-hash-dependent perturbation makes the decoding non-trivial; logits
sharpen as the row fills up, so the threshold commits several tokens late in a block.

``grid=True`` gives it Fast-dLLM v2's prompt layout (``DecodingRules.prompt_on_block_grid``: whole prompt
blocks prefilled, the prompt's tail opening the first block), else NLD's.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from specfold_compile.models.config import DecodingRules


@dataclass
class FakeCache:
    tokens: tuple
    next_logits: torch.Tensor

    @property
    def length(self) -> int:
        return len(self.tokens)


class FakeModel:
    def __init__(self, block_size=8, sub_block_size=None, vocab_size=16, seed=0, noise=0.35,
                 sharpen=0.5, scale=2.5, mask_token_id=None, eos_token_id=1, grid=False,
                 max_position_embeddings=4096):
        mask = vocab_size - 1 if mask_token_id is None else mask_token_id
        rules = DecodingRules(prompt_on_block_grid=grid, threshold_inclusive=not grid, argmax_of_probs=grid)
        self.config = SimpleNamespace(block_size=block_size, sub_block_size=sub_block_size,
                                      mask_token_id=mask, eos_token_id=eos_token_id, vocab_size=vocab_size,
                                      max_position_embeddings=max_position_embeddings, decoding_rules=rules)
        g = torch.Generator().manual_seed(seed)
        self.P, self.Q = 251, 509
        self.base = torch.randn(self.P, block_size, vocab_size, generator=g)
        self.base[..., eos_token_id] -= 1.0  # eos possible but not too frequent
        self.noise = torch.randn(self.Q, block_size, vocab_size, generator=g) * noise
        self.seed_tab = torch.randn(self.P, vocab_size, generator=g) * 3.0
        self.seed_tab[:, eos_token_id] -= 2.0
        self.sharpen, self.scale = sharpen, scale
        self.calls = []  # ("prefill"|"call"|"write", N)

    @staticmethod
    def _h(seq, mod):
        return hash(tuple(int(t) for t in seq)) % mod

    def _make_cache(self, tokens):
        nl = self.seed_tab[self._h(tokens, self.P)].clone()
        nl[self.config.mask_token_id] = -1e4
        return FakeCache(tuple(tokens), nl)

    def prefill(self, prompt_ids, block_causal=False):
        assert prompt_ids.dim() == 1 and prompt_ids.dtype == torch.int64
        assert block_causal == self.config.decoding_rules.prompt_on_block_grid
        if block_causal:
            assert prompt_ids.numel() % self.config.block_size == 0, "prefill of a partial block"
        if prompt_ids.numel():  # an empty prompt runs no forward
            self.calls.append(("prefill", 1))
        return self._make_cache(prompt_ids.tolist())

    def write_block(self, cache, block):
        B = self.config.block_size
        assert block.shape == (B,) and block.dtype == torch.int64
        assert not bool((block == self.config.mask_token_id).any()), "write_block with a masked block"
        self.calls.append(("write", 1))
        return self._make_cache(list(cache.tokens) + block.tolist())

    def __call__(self, tokens, parents, cache, logit_positions=None):
        B, V = self.config.block_size, self.config.vocab_size
        assert tokens.dim() == 2 and tokens.shape[1] == B and tokens.dtype == torch.int64
        assert parents.shape == (tokens.shape[0],) and int(parents[0]) == -1
        for n in range(1, tokens.shape[0]):
            assert 0 <= int(parents[n]) < n
        self.calls.append(("call", tokens.shape[0]))
        base = self.base[self._h(cache.tokens, self.P)]
        out = torch.empty(tokens.shape[0], B, V)
        for n, row in enumerate(tokens.tolist()):
            k = sum(1 for t in row if t != self.config.mask_token_id)
            lg = base * (self.scale * (1.0 + self.sharpen * k)) + self.noise[self._h(row, self.Q)] * (1 + k)
            lg[:, self.config.mask_token_id] = -1e4
            out[n] = lg
        return out if logit_positions is None else out.flatten(0, 1)[logit_positions]

    @property
    def nfe(self):
        return len(self.calls)
