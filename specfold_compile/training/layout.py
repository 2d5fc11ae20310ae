"""The block-diffusion training layout (Fast-dLLM v2 style) and its attention mask.

One row per example, the same for every row of a batch (so positions are shared, ``[T]``):

    [ prompt, left-padded to P | clean response, R | noisy copy A, R | noisy copy B, R ]
      positions 0..P-1           P..P+R-1            P..P+R-1          P..P+R-1

The response is ``response + <|eos|>`` filled with ``<|eos|>`` up to a multiple of the block size (32),
then padded with whole pad blocks up to R. Response blocks start right after the prompt (block boundaries
are relative to the response start), exactly as the decoder generates them. Left padding only shifts the
absolute positions of a row, which RoPE attention does not see (it depends on position differences).

Token types: PAD (attends only to itself, nobody attends to it), PROMPT (causal over the prompt: the
decoder's prefill), CLEAN (response block j attends to the prompt and clean blocks <= j: a finished block
written to the cache), NOISY_A / NOISY_B (noisy block i attends to the prompt, clean blocks < i and its own
noisy block, bidirectionally: the block being denoised). A and B carry complementary masks, so every
response token except each block's first gets a masked-token loss exactly once per example.

Loss targets (layout index u is predicted from the logits at u - 1, the Fast-dLLM v2 shift):
masked tokens of A and B (never block offset 0, so u - 1 is in the same noisy block), and the first token
of every clean block (u - 1 is the last prompt token or the last token of the previous clean block: the
seed the decoder reads from the prefill / block-write pass).
"""

from __future__ import annotations

import torch
from torch import Tensor

PAD_T, PROMPT_T, CLEAN_T, NOISY_A, NOISY_B = 0, 1, 2, 3, 4
IGNORE = -100


def attention_mask(typ: Tensor, blk: Tensor) -> Tensor:
    """typ, blk: int [b, T] (blk = response block index, anything for other types) -> bool [b, T, T]
    (True = query row may attend to key column). Rows are laid out in cache order (prompt, then clean)."""
    T = typ.shape[1]
    idx = torch.arange(T, device=typ.device)
    qt, kt = typ[:, :, None], typ[:, None, :]
    qb, kb = blk[:, :, None], blk[:, None, :]
    k_prompt = kt == PROMPT_T
    k_clean = kt == CLEAN_T
    causal = (idx[:, None] >= idx[None, :])[None]
    m = (qt == PROMPT_T) & k_prompt & causal
    m = m | ((qt == CLEAN_T) & (k_prompt | (k_clean & (kb <= qb))))
    for noisy in (NOISY_A, NOISY_B):
        m = m | ((qt == noisy) & (k_prompt | (k_clean & (kb < qb)) | ((kt == noisy) & (kb == qb))))
    eye = torch.eye(T, dtype=torch.bool, device=typ.device)[None]
    m = m | ((qt == PAD_T) & eye)
    return m


class Layout:
    """Fixed layout sizes: prompt region P (left-padded) and response region R (a multiple of block)."""

    def __init__(self, prompt_len: int, resp_len: int, block: int = 32):
        if resp_len % block:
            raise ValueError(f"resp_len: expected a multiple of block={block}, got {resp_len}")
        self.P, self.R, self.block = prompt_len, resp_len, block
        self.T = prompt_len + 3 * resp_len

    def positions(self, device=None) -> Tensor:
        P, R = self.P, self.R
        return torch.cat([torch.arange(P + R), P + torch.arange(R), P + torch.arange(R)]).to(device)

    def meta(self, plen: Tensor, nblk: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """plen, nblk: int64 [b] -> typ, blk, off int64 [b, T] (blk/off are -1 outside the response)."""
        P, R, B = self.P, self.R, self.block
        dev = plen.device
        idx = torch.arange(self.T, device=dev)[None, :]
        plen, rlen = plen[:, None], (nblk * B)[:, None]
        typ = torch.zeros(plen.shape[0], self.T, dtype=torch.long, device=dev)
        typ = torch.where((idx >= P - plen) & (idx < P), PROMPT_T, typ)
        blk = torch.full_like(typ, -1)
        off = torch.full_like(typ, -1)
        for t, start in ((CLEAN_T, P), (NOISY_A, P + R), (NOISY_B, P + 2 * R)):
            j = idx - start
            inside = (j >= 0) & (j < rlen)
            typ = torch.where(inside, t, typ)
            blk = torch.where(inside, j // B, blk)
            off = torch.where(inside, j % B, off)
        return typ, blk, off

    def row(self, prompt: list[int], response_blocks: list[int], pad_id: int) -> list[int]:
        """The clean ids of one example (response already filled to whole blocks)."""
        P, R = self.P, self.R
        if len(prompt) > P or len(response_blocks) > R or len(response_blocks) % self.block:
            raise ValueError("example does not fit the layout")
        resp = response_blocks + [pad_id] * (R - len(response_blocks))
        return [pad_id] * (P - len(prompt)) + prompt + resp + resp + resp


def fill_response(response: list[int], eos_id: int, block: int = 32) -> list[int]:
    """response + eos, filled with eos up to a multiple of ``block``."""
    r = list(response) + [eos_id]
    return r + [eos_id] * (-len(r) % block)


def make_batch(ids: Tensor, plen: Tensor, nblk: Tensor, layout: Layout, mask_id: int,
               generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Clean layout rows -> (input ids with complementary masks, targets aligned to ids, attention mask).

    Targets are aligned with the input (targets[:, u] is the token at u); the loss compares
    ``logits[:, :-1]`` with ``targets[:, 1:]``."""
    ids = ids.long()
    b, dev = ids.shape[0], ids.device
    typ, blk, off = layout.meta(plen, nblk)
    nb = layout.R // layout.block
    rate = torch.rand(b, nb, device=dev, generator=generator)
    u = torch.rand(b, nb, layout.block, device=dev, generator=generator)
    bc, oc = blk.clamp(min=0), off.clamp(min=0)
    rate_t = rate.gather(1, bc)
    u_t = u[torch.arange(b, device=dev)[:, None], bc, oc]
    maskable = off > 0
    mask_a = (typ == NOISY_A) & maskable & (u_t < rate_t)
    mask_b = (typ == NOISY_B) & maskable & (u_t >= rate_t)
    masked = mask_a | mask_b
    inp = torch.where(masked, mask_id, ids)
    seeds = (typ == CLEAN_T) & (off == 0)
    targets = torch.where(masked | seeds, ids, IGNORE)
    return inp, targets, attention_mask(typ, blk)


def shifted_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy of position u's token from the logits at u - 1 (mean over targets)."""
    lg = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
    return torch.nn.functional.cross_entropy(lg, targets[:, 1:].reshape(-1), ignore_index=IGNORE)
