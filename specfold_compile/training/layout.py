"""The block-diffusion training layout on the absolute block grid (Fast-dLLM v2) and its attention mask.

An example is its prompt (``L`` tokens, ``<|bos|> ... <|sep|>``) followed by its response and ``<|eos|>``,
filled with ``<|eos|>`` to the end of a block. Blocks sit on absolute positions ``[32k, 32k + 32)``
counted from the first prompt token, exactly where the decoder puts them: the prompt's ``nP = L // 32``
whole blocks are prefilled, its last ``L mod 32`` tokens (the *tail*) open the first decoded block, and
the ``nD`` decoded blocks ``nP .. nP + nD - 1`` follow. Examples are grouped by ``(nP, nD)``; every row of
a group has the same layout, positions and attention mask (no padding at all):

    [ clean blocks 0 .. nP+nD-2 | noisy copy A: blocks nP .. nP+nD-1 | noisy copy B: the same blocks ]
      positions 0 .. 32(nP+nD-1)-1   32nP .. 32(nP+nD)-1                  32nP .. 32(nP+nD)-1

Attention (``block_attention_mask``): a clean block attends to clean blocks <= its own (the block-causal
prefill of the prompt's whole blocks, and the pass that writes a finished block to the cache); a noisy
block attends to the clean blocks before it and, bidirectionally, to itself in its own copy (the block
being denoised against the cache). The last decoded block is never written (it holds the eos), so its
clean copy would only be attended by itself and is left out.

Noise: A and B mask complementary subsets of each block's *maskable* tokens: response tokens at block
position >= 1. Block position 0 is never masked by the decoder (it holds the prompt's tail or a seed),
nor is any prompt token. Loss targets (``targets[:, s]`` is the token ``logits[:, s]`` must predict):
a masked token at layout index u is read from the logits at u - 1, the Fast-dLLM v2 shift, which lies
in the same noisy block; the seed of every block that starts with a generated token (block position 0
of decoded blocks after the first, and of the first when ``L mod 32 == 0``) is read from the last
position of the clean block before it: the prefill's or the block write's last logit, as the decoder
reads it. So every response token has exactly one loss term per example.
"""

from __future__ import annotations

import torch
from torch import Tensor

PAD_T, CLEAN_T, NOISY_A, NOISY_B = 0, 1, 2, 3
IGNORE = -100


def block_attention_mask(kind: Tensor, blk: Tensor) -> Tensor:
    """kind, blk: int [..., T] (token kind and absolute block index) -> bool [..., T, T] (True = the query
    row may attend to the key column). CLEAN sees CLEAN blocks <= its own; NOISY_A / NOISY_B see CLEAN blocks
    before their own and their own block of the same copy; PAD sees only itself and nobody sees it."""
    qt, kt = kind[..., :, None], kind[..., None, :]
    qb, kb = blk[..., :, None], blk[..., None, :]
    k_clean = kt == CLEAN_T
    m = (qt == CLEAN_T) & k_clean & (kb <= qb)
    noisy_q = (qt == NOISY_A) | (qt == NOISY_B)
    m = m | (noisy_q & ((k_clean & (kb < qb)) | ((kt == qt) & (kb == qb))))
    T = kind.shape[-1]
    eye = torch.eye(T, dtype=torch.bool, device=kind.device)
    return m | ((qt == PAD_T) & eye)


def grid_blocks(prompt_len: int, response_len: int, block: int = 32) -> tuple[int, int]:
    """(nP, nD) of an example: the prompt's whole blocks and the decoded blocks that hold its tail, the
    response (``response_len`` tokens, without eos) and the eos."""
    if prompt_len < 1 or response_len < 0:
        raise ValueError(f"prompt_len, response_len: expected >= 1 and >= 0, got {prompt_len}, {response_len}")
    n_prompt = prompt_len // block
    total = -(-(prompt_len + response_len + 1) // block)
    return n_prompt, total - n_prompt


def fill_response(response: list[int], prompt_len: int, eos_id: int, block: int = 32) -> list[int]:
    """response + eos, filled with eos up to the end of the absolute block (``prompt_len + len`` is a
    multiple of ``block``)."""
    r = list(response) + [eos_id]
    return r + [eos_id] * (-(prompt_len + len(r)) % block)


class Layout:
    """The fixed layout of the examples with ``n_prompt`` whole prompt blocks and ``n_decoded`` decoded
    blocks. Index tensors are built once per device (``tensors``)."""

    def __init__(self, n_prompt: int, n_decoded: int, block: int = 32):
        if n_prompt < 0 or n_decoded < 1 or block < 2:
            raise ValueError(f"n_prompt, n_decoded, block: expected >= 0, >= 1, >= 2, got "
                             f"{n_prompt}, {n_decoded}, {block}")
        self.n_prompt, self.n_decoded, self.block = n_prompt, n_decoded, block
        self.C = block * (n_prompt + n_decoded - 1)  # clean stream
        self.D = block * n_decoded                    # one noisy copy
        self.T = self.C + 2 * self.D
        self._cache: dict[str, dict[str, Tensor]] = {}

    def __repr__(self) -> str:
        return f"Layout(n_prompt={self.n_prompt}, n_decoded={self.n_decoded}, block={self.block}, T={self.T})"

    def tensors(self, device=None) -> dict[str, Tensor]:
        """Per-index constants [T]: ``pos`` (absolute position, also the RoPE position), ``kind``, ``blk``
        (absolute block), ``dec`` (index into a decoded-block span of D for noisy indices, -1 otherwise),
        ``seed_at`` (for the last index of each clean block: the layout index holding the next block's
        first token, -1 elsewhere), and ``mask`` bool [T, T]."""
        key = str(torch.empty(0, device=device).device)  # "cuda" and "cuda:0" are one entry
        if key not in self._cache:
            C, D, B = self.C, self.D, self.block
            start = B * self.n_prompt  # absolute position of the first decoded block
            span = torch.arange(D)
            pos = torch.cat([torch.arange(C), start + span, start + span])
            kind = torch.cat([torch.full((C,), CLEAN_T), torch.full((D,), NOISY_A), torch.full((D,), NOISY_B)])
            dec = torch.cat([torch.full((C,), -1), span, span])
            # The token at absolute position p (p a block start, p >= B) is in the clean stream at p when
            # p < C, else (the last decoded block, not in the clean stream) in copy A at C + p - start.
            seed_at = torch.full((self.T,), -1)
            for p in range(B, C + B, B):
                seed_at[p - 1] = p if p < C else C + p - start
            self._cache[key] = {
                "pos": pos.to(device), "kind": kind.to(device), "blk": (pos // B).to(device),
                "dec": dec.to(device), "seed_at": seed_at.to(device),
                "mask": block_attention_mask(kind, pos // B).to(device)}
        return self._cache[key]

    def positions(self, device=None) -> Tensor:
        return self.tensors(device)["pos"]

    def mask(self, device=None) -> Tensor:
        return self.tensors(device)["mask"]

    def row(self, prompt: list[int], filled_response: list[int]) -> list[int]:
        """The clean ids of one example (``filled_response`` from ``fill_response``)."""
        full = list(prompt) + list(filled_response)
        B = self.block
        if len(prompt) // B != self.n_prompt or len(full) != B * (self.n_prompt + self.n_decoded):
            raise ValueError(f"example: prompt of {len(prompt)} tokens and {len(full)} tokens in all do not "
                             f"fit {self!r} (expected {B * (self.n_prompt + self.n_decoded)} in all)")
        start = B * self.n_prompt
        return full[:self.C] + full[start:] + full[start:]


def make_batch(ids: Tensor, plen: Tensor, layout: Layout, mask_id: int,
               generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Clean layout rows ``ids`` [b, T] and prompt lengths ``plen`` [b] -> (input ids with complementary
    masks [b, T], targets [b, T], attention mask [T, T], shared by the rows).

    ``targets[:, s]`` is the token that ``logits[:, s]`` must predict (IGNORE elsewhere): the shift is in
    the targets, so the loss is a plain cross-entropy (``layout_loss``)."""
    ids = ids.long()
    b, dev = ids.shape[0], ids.device
    t = layout.tensors(dev)
    pos, kind, dec, seed_at = t["pos"], t["kind"], t["dec"], t["seed_at"]
    plen = plen.long()[:, None]
    rate = torch.rand(b, layout.n_decoded, device=dev, generator=generator)
    u = torch.rand(b, layout.D, device=dev, generator=generator)
    d = dec.clamp(min=0)
    u_t = u[:, d]                                   # the same draw for a token in A and in B
    rate_t = rate[:, d // layout.block]
    maskable = (pos >= plen) & (pos % layout.block != 0) & (dec >= 0)
    masked = maskable & torch.where(kind == NOISY_A, u_t < rate_t, u_t >= rate_t)
    inp = torch.where(masked, mask_id, ids)
    targets = torch.full_like(ids, IGNORE)
    targets[:, :-1] = torch.where(masked[:, 1:], ids[:, 1:], IGNORE)
    # seeds: the next block's first token, where it is a response token (not the prompt's tail)
    src = seed_at.clamp(min=0)
    is_seed = (seed_at >= 0) & (pos[src] >= plen)
    targets = torch.where(is_seed, ids[:, src], targets)
    return inp, targets, t["mask"]


def layout_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of the targets (``targets[:, s]`` read from ``logits[:, s]``)."""
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                                             ignore_index=IGNORE)
