"""A minimal batched greedy vanilla decoder for the training self-check (no KV cache).

Same convention as SPEC.md section 1 for Fast-dLLM v2: causal prefill of the prompt, whose last logits
give the first block's seed (block position 0); each block of 32 is denoised sub-block by sub-block (8):
one forward per step, commit by the package's rule (``decoding.commit``: every masked position of the
current sub-block whose confidence is above ``threshold``, plus always the most confident one); position
p reads the logits computed at p - 1. The tokens equal ``decoding.generate(mode="vanilla")`` (tested).
A finished block is written with one more forward (attending to the prefix and, bidirectionally, to
itself); its last logits seed the next block. Decoding stops after a block that contains eos. Every
forward counts in NFE.

Instead of a cache, each forward re-runs the prefix with the mask the cache would have been written with
(prompt causal, finished blocks block-causal), using the training layout's token types. Rows are
right-aligned so that all rows share one position vector; RoPE only sees position differences.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..decoding.commit import commit, confidence
from .layout import CLEAN_T, NOISY_A, PAD_T, PROMPT_T, attention_mask


@torch.no_grad()
def vanilla_decode(model, prompts: list[list[int]], *, mask_id: int, eos_id: int, pad_id: int,
                   block: int = 32, sub_block: int = 8, threshold: float = 0.9, max_blocks: int = 3,
                   batch_size: int = 64) -> tuple[list[list[int]], list[int]]:
    """Greedy vanilla decoding of each prompt (ids incl. bos/sep). Returns (generated ids, NFE) per prompt;
    the ids are whole blocks (truncate at the first eos yourself)."""
    outs: list[list[int]] = []
    nfes: list[int] = []
    for i in range(0, len(prompts), batch_size):
        o, n = _decode_batch(model, prompts[i:i + batch_size], mask_id, eos_id, pad_id, block, sub_block,
                             threshold, max_blocks)
        outs += o
        nfes += n
    return outs, nfes


def _decode_batch(model, prompts, mask_id, eos_id, pad_id, block, sub_block, threshold, max_blocks):
    device = next(model.parameters()).device
    n = len(prompts)
    blocks: list[list[list[int]]] = [[] for _ in range(n)]
    cur: list[list[int] | None] = [None] * n  # None: the next forward is a prefill / block write
    nfe = [0] * n
    done = [False] * n
    while not all(done):
        act = [r for r in range(n) if not done[r]]
        cleans = [list(prompts[r]) + [t for b in blocks[r] for t in b] for r in act]
        C = max(len(c) for c in cleans)
        any_noisy = any(cur[r] is not None for r in act)
        L = C + (block if any_noisy else 0)
        ids = torch.full((len(act), L), pad_id, dtype=torch.long)
        typ = torch.full((len(act), L), PAD_T, dtype=torch.long)
        blk = torch.full((len(act), L), -1, dtype=torch.long)
        for j, r in enumerate(act):
            c, p = cleans[j], len(prompts[r])
            s = C - len(c)
            ids[j, s:C] = torch.tensor(c)
            typ[j, s:s + p] = PROMPT_T
            typ[j, s + p:C] = CLEAN_T
            blk[j, s + p:C] = torch.arange(len(c) - p) // block
            if cur[r] is not None:
                ids[j, C:] = torch.tensor(cur[r])
                typ[j, C:] = NOISY_A
                blk[j, C:] = len(blocks[r])
        mask = attention_mask(typ, blk).to(device)
        logits = model.forward_sequence(ids.to(device), torch.arange(L, device=device), mask).float()
        # the package's commit rule (decoding.commit); the distribution of block position q is read at
        # layout index C + q - 1, and the seed of a block at C - 1
        conf, tok = confidence(logits[:, C - 1:C + (block - 1 if any_noisy else 0)], mask_id)
        conf, tok = conf.cpu(), tok.cpu()
        for j, r in enumerate(act):
            nfe[r] += 1
            if cur[r] is None:  # prefill or block write: read the seed of the next block
                if blocks[r] and (eos_id in blocks[r][-1] or len(blocks[r]) >= max_blocks):
                    done[r] = True
                    continue
                cur[r] = [int(tok[j, 0])] + [mask_id] * (block - 1)
                continue
            state = commit(torch.tensor(cur[r]), conf[j], tok[j], mask_id, sub_block, threshold)
            cur[r] = state.tolist()
            if mask_id not in cur[r]:
                blocks[r].append(cur[r])
                cur[r] = None
    return [[t for b in blocks[r] for t in b] for r in range(n)], nfe
