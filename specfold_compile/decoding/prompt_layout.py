"""Where a prompt's tokens go before decoding: the prefill, the first block, and the positions the blocks
of a generation occupy (the family's ``DecodingRules.prompt_on_block_grid``, docs/SPEC.md section 1).

Fast-dLLM v2 (its reference ``generate``): blocks sit on the absolute grid ``[kB, kB + B)`` counted from
the first prompt token. The prompt's whole blocks, its first ``floor(L / B) * B`` tokens, are prefilled in
one block-causal pass (nothing when ``L < B``: the cache starts empty). The first decoded block holds the
prompt's last ``L mod B`` tokens, fixed and attended bidirectionally, then masks; only when ``L mod B ==
0`` does position 0 of that block take the prefill's seed. The reference skips the prefill, and with it
the whole prompt, when ``L == B`` exactly (its prefill runs only for ``L > B``): an upstream bug this
layout does not copy (a prompt of one block is prefilled like any other whole block).

NLD (its reference ``generate``): the whole prompt is prefilled causally and the first block starts right
after it, its position 0 the prefill's seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PromptLayout", "layout_prompt"]


@dataclass(frozen=True)
class PromptLayout:
    prefill_ids: torch.Tensor  # the prompt tokens of the prefill pass (none: no prefill forward)
    block_causal: bool         # the prefill's mask: block-causal, else causal
    head: list[int]            # prompt tokens that open the first decoded block, fixed (fewer than B)
    block_size: int

    @property
    def first_block(self) -> int:
        """Absolute position of the first decoded block."""
        return int(self.prefill_ids.numel())

    def blocks_end(self, max_new_tokens: int) -> int:
        """Absolute end of the last block a generation of ``max_new_tokens`` may decode: the verification
        forward always covers whole blocks."""
        blocks = -(-(len(self.head) + max_new_tokens) // self.block_size)
        return self.first_block + blocks * self.block_size

    def last_block_start(self, max_new_tokens: int) -> int:
        """The longest prefix the decode loop writes: the last block is never written."""
        return self.blocks_end(max_new_tokens) - self.block_size

    def max_new_tokens_within(self, max_positions: int) -> int:
        """The most new tokens whose blocks end at or below ``max_positions`` (<= 0: none fit)."""
        whole = (max_positions - self.first_block) // self.block_size * self.block_size
        return whole - len(self.head)

    def check_positions(self, max_new_tokens: int, max_positions: int) -> None:
        """One-line ``ValueError`` (naming the argument) when the generation's blocks would pass the
        model's position limit, before anything runs."""
        fit = self.max_new_tokens_within(max_positions)
        if fit < 1:
            raise ValueError(f"prompt_ids: {self.first_block + len(self.head)} tokens leave no room for a "
                             f"block of {self.block_size} within max_position_embeddings={max_positions}")
        if max_new_tokens > fit:
            raise ValueError(f"max_new_tokens: {max_new_tokens} new tokens after a prompt of "
                             f"{self.first_block + len(self.head)} need positions up to "
                             f"{self.blocks_end(max_new_tokens)} (whole blocks of {self.block_size}), beyond "
                             f"max_position_embeddings={max_positions}; at most {fit} fit")


def layout_prompt(prompt_ids: torch.Tensor, block_size: int, on_block_grid: bool) -> PromptLayout:
    """``prompt_ids`` (1-D) laid out for decoding (module docstring)."""
    if not on_block_grid:
        return PromptLayout(prompt_ids, False, [], block_size)
    whole = prompt_ids.numel() // block_size * block_size
    return PromptLayout(prompt_ids[:whole], True, prompt_ids[whole:].tolist(), block_size)
