"""A minimal batched greedy vanilla decoder for the training self-check (no KV cache).

Fast-dLLM v2 prompt handling on the absolute block grid (docs/SPEC.md section 1), the layout the model is
trained with (``layout.py``): blocks sit on positions ``[32k, 32k + 32)`` from the first prompt token.
A prompt of ``L`` tokens has ``L // 32`` whole blocks (the prefill, block-causal); the first decoded
block holds its last ``L mod 32`` tokens (fixed, never masked) followed by masks, or, when
``L mod 32 == 0``, a seed read from the prefill's last logit at block position 0. Each block is denoised
one forward per step, sub-block by sub-block (the 8-aligned windows of the absolute block), with the
package's commit rule (``decoding.commit``: every masked position of the current sub-block whose
confidence is above ``threshold``, plus always the most confident one); position p reads the logit
computed at p - 1, block position 0 its own. A block is done when ``decoding.commit.block_finished``
says so (no mask left, or an eos with no mask before it); decoding stops after a block with an eos, at
an eos seed, or after ``max_blocks`` blocks. Otherwise the finished block is written (one forward attending to the prefix
and, bidirectionally, to itself) and its last logit seeds the next block.

Instead of a cache, every forward re-runs the prefix under the mask the cache would have been written
with (``layout.block_attention_mask``: prefix blocks block-causal, the current block attending to them
and to itself). Rows are left-padded by whole blocks so all rows share one position vector and the grid
(RoPE only sees position differences). NFE counts what the cached decoder runs: the prefill (when the
prompt has a whole block; here it is only run when its logit is the seed), every denoising step and
every block write.
"""

from __future__ import annotations

import torch

from ..decoding.commit import block_finished, commit, confidence, next_token
from .layout import CLEAN_T, NOISY_A, PAD_T, block_attention_mask


@torch.no_grad()
def vanilla_decode(model, prompts: list[list[int]], *, mask_id: int, eos_id: int, pad_id: int,
                   block: int = 32, sub_block: int = 8, threshold: float = 0.9, max_blocks: int = 3,
                   batch_size: int = 64) -> tuple[list[list[int]], list[int]]:
    """Greedy vanilla decoding of each prompt (ids incl. bos/sep). Returns (generated ids, NFE) per prompt;
    the ids run to the end of the last decoded block (truncate at the first eos yourself; positions after
    an eos may still hold the mask id)."""
    outs: list[list[int]] = []
    nfes: list[int] = []
    for i in range(0, len(prompts), batch_size):
        o, n = _decode_batch(model, prompts[i:i + batch_size], mask_id, eos_id, pad_id, block, sub_block,
                             threshold, max_blocks)
        outs += o
        nfes += n
    return outs, nfes


class _Row:
    """One prompt's decoding state: the finished blocks (the prefix) and the current block."""

    def __init__(self, prompt: list[int], block: int, mask_id: int):
        if not prompt:
            raise ValueError("prompts: expected at least one token per prompt")
        n_whole = len(prompt) // block * block
        self.prefix = [list(prompt[i:i + block]) for i in range(0, n_whole, block)]
        self.fixed = len(prompt) - n_whole  # the prompt's tail opens the first block
        # the prefill, counted here when its logit is not needed (it then only fills the cache), else
        # when it runs as the first forward
        self.nfe = 1 if self.prefix and self.fixed else 0
        self.out: list[int] = []
        self.blocks_done = 0
        self.done = False
        if self.fixed:
            self.cur = list(prompt[n_whole:]) + [mask_id] * (block - self.fixed)
            self.writing = False
        else:  # the next forward reads the seed from the prefix's last logit
            self.cur = self.prefix.pop()
            self.writing = True


def _decode_batch(model, prompts, mask_id, eos_id, pad_id, block, sub_block, threshold, max_blocks):
    device = next(model.parameters()).device
    rows = [_Row(p, block, mask_id) for p in prompts]
    while True:
        act = [r for r in rows if not r.done]
        if not act:
            break
        M = max(len(r.prefix) for r in act)
        S = (M + 1) * block
        ids = torch.full((len(act), S), pad_id, dtype=torch.long)
        kind = torch.full((len(act), S), PAD_T, dtype=torch.long)
        blk = torch.arange(S).repeat(len(act), 1) // block
        for j, r in enumerate(act):
            first = (M - len(r.prefix)) * block  # whole pad blocks on the left keep the grid
            if r.prefix:
                ids[j, first:M * block] = torch.tensor([t for b in r.prefix for t in b])
                kind[j, first:M * block] = CLEAN_T
            ids[j, M * block:] = torch.tensor(r.cur)
            kind[j, M * block:] = NOISY_A
        mask = block_attention_mask(kind, blk).to(device)
        logits = model.forward_sequence(ids.to(device), torch.arange(S, device=device), mask)[:, M * block:]
        # Fast-dLLM v2 shift: block position p reads the logit at p - 1, position 0 its own
        shifted = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        conf, tok = confidence(shifted.float(), mask_id)
        seed = next_token(logits[:, -1], mask_id)
        conf, tok, seed = conf.cpu(), tok.cpu(), seed.cpu()
        for j, r in enumerate(act):
            r.nfe += 1
            if r.writing:  # prefill or block write: the last logit seeds the next block
                r.prefix.append(r.cur)
                r.cur = [int(seed[j])] + [mask_id] * (block - 1)
                r.fixed, r.writing = 0, False
                if r.cur[0] == eos_id:  # an eos seed ends the answer: no denoising step follows
                    r.out.append(eos_id)
                    r.done = True
                continue
            r.cur = commit(torch.tensor(r.cur), conf[j], tok[j], mask_id, sub_block, threshold).tolist()
            generated = r.cur[r.fixed:]
            if not block_finished(generated, mask_id, len(generated), eos_id):
                continue
            r.out += generated
            r.blocks_done += 1
            if eos_id in generated or r.blocks_done >= max_blocks:
                r.done = True
            else:
                r.writing = True
    return [r.out for r in rows], [r.nfe for r in rows]
