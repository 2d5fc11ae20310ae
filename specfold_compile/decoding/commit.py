"""The greedy threshold commit rule (docs/SPEC.md section 1) and the confidence ranking used by drafts.

All bookkeeping here runs on small CPU tensors: a block state is an int64 tensor ``[B]`` holding
``mask_token_id`` at still-masked positions (``block_finished`` also takes it as a list of ints, as the
drafts check theirs); ``conf`` / ``tok`` are the per-position top-1 softmax probability (float32, or the
model's dtype under ``confidence(dtype="model")``) and argmax token of one row's logits (read at masked
positions only: the decode loop leaves the others at conf 0 and the mask token).
"""

from __future__ import annotations

import torch

__all__ = [
    "confidence",
    "spread_confidences",
    "next_token",
    "window_positions",
    "commit",
    "commit_positions",
    "rank_masked_positions",
    "block_finished",
]


def confidence(logits: torch.Tensor, mask_id: int | None = None, dtype: str = "float32",
               argmax_of_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-1 softmax probability and its token over the last dim of ``logits`` (any leading shape), on
    the logits' device.

    ``dtype="float32"``: ``softmax(logits.float())``, the token the argmax of the logits, ``conf`` float32.
    ``dtype="model"``: the softmax in the logits' own dtype, as both reference implementations compute it
    (``torch.softmax`` of bf16 logits is bf16), ``conf`` in that dtype: ``commit`` compares it with the
    threshold there, so a bf16 model commits where ``p > bf16(0.9) = 0.8984375`` in bf16, as its
    reference does. The token: the argmax of those probabilities with ``argmax_of_probs`` (Fast-dLLM v2's
    reference; rounding can tie two tokens, the lower id wins), else of the logits (NLD's).
    Ties in an argmax go to the lowest token id. With ``mask_id`` given, the mask token is never the
    token (committing it would not make progress); ``conf`` is then the probability of the best non-mask
    token under the full softmax. Returns ``(conf, tok int64)``.
    """
    if dtype not in ("float32", "model"):
        raise ValueError(f"dtype: expected 'float32' or 'model', got {dtype!r}")
    excluded = mask_id is not None and 0 <= mask_id < logits.shape[-1]
    if dtype == "model":
        probs = torch.softmax(logits, dim=-1)
        if argmax_of_probs:
            if excluded:
                probs[..., mask_id] = -1.0  # its probability is not read again
            tok = torch.argmax(probs, dim=-1)
        else:
            tok = torch.argmax(_without(logits, mask_id) if excluded else logits, dim=-1)
        return torch.gather(probs, -1, tok.unsqueeze(-1)).squeeze(-1), tok
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1)
    if excluded:
        lf = _without(lf, mask_id)
    tok = torch.argmax(lf, dim=-1)
    mx = torch.gather(lf, -1, tok.unsqueeze(-1)).squeeze(-1)
    conf = torch.exp(mx - lse)  # = softmax(logits.float())[tok]
    return conf, tok


def spread_confidences(conf: torch.Tensor, tok: torch.Tensor, positions: torch.Tensor, size: int,
                       mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``confidence``'s ``conf`` and ``tok`` [M] at the flat ``positions`` [M] (of the logits asked for)
    spread over all ``size`` positions: elsewhere conf 0 and the mask token, which nothing reads (commits
    and drafts look at masked positions only). Tensor ops on ``conf``'s device, no host read."""
    full_conf = torch.zeros(size, dtype=conf.dtype, device=conf.device).index_put_((positions,), conf)
    full_tok = torch.full((size,), mask_id, dtype=tok.dtype, device=tok.device).index_put_((positions,), tok)
    return full_conf, full_tok


def next_token(logits: torch.Tensor, mask_id: int | None = None) -> torch.Tensor:
    """The token ``confidence(logits, mask_id)`` picks (the argmax over the last dim, the mask token
    excluded, ties to the lowest id) without its probability: a block's seed needs the token only, and
    this is three kernels where ``confidence`` launches seven. The argmax runs in the logits' own dtype,
    whose order the float32 copy keeps exactly."""
    excluded = mask_id is not None and 0 <= mask_id < logits.shape[-1]
    return torch.argmax(_without(logits, mask_id) if excluded else logits, dim=-1)


def _without(logits: torch.Tensor, token: int) -> torch.Tensor:
    """A copy of ``logits`` in which ``token`` never wins an argmax."""
    out = logits.clone()
    out[..., token] = float("-inf")
    return out


def window_positions(state: torch.Tensor, mask_id: int, sub_block_size: int | None) -> torch.Tensor:
    """Masked positions that may be committed now.

    ``sub_block_size=None`` (NLD): every masked position of the block. Otherwise (Fast-dLLM v2): the
    masked positions of the first sub-block that still has a mask. Returns int64 positions, ascending.
    """
    masked = (state == mask_id).nonzero().flatten()
    if sub_block_size is None or masked.numel() == 0:
        return masked
    sb = int(masked[0]) // sub_block_size
    return masked[(masked // sub_block_size) == sb]


def commit_positions(state, conf, mask_id, sub_block_size, threshold, inclusive: bool = False) -> torch.Tensor:
    """Positions the vanilla rule commits: window positions with ``conf > threshold`` (``inclusive``:
    ``conf >= threshold``, NLD's rule), and always at least the single most confident window position
    (ties -> lowest index). The comparison runs in ``conf``'s dtype, the threshold cast to it (a Python
    float against a tensor, as the references compare). Empty if nothing is masked."""
    win = window_positions(state, mask_id, sub_block_size)
    if win.numel() == 0:
        return win
    c = conf[win]
    sel = win[c >= threshold] if inclusive else win[c > threshold]
    if sel.numel() == 0:
        # torch.argmax returns the first maximal index, i.e. the lowest position on ties
        sel = win[int(torch.argmax(c))].reshape(1)
    return sel


def commit(state: torch.Tensor, conf: torch.Tensor, tok: torch.Tensor, mask_id: int,
           sub_block_size: int | None, threshold: float, inclusive: bool = False) -> torch.Tensor:
    """Apply one vanilla denoising step to ``state`` given its logits' ``(conf, tok)``; returns a new
    state (the input is not modified). ``inclusive``: see ``commit_positions``."""
    out = state.clone()
    pos = commit_positions(state, conf, mask_id, sub_block_size, threshold, inclusive)
    out[pos] = tok[pos]
    return out


def rank_masked_positions(state: torch.Tensor | list[int], conf: torch.Tensor | list[float], mask_id: int,
                          sub_block_size: int | None) -> list[int]:
    """Masked positions of ``state`` in draft-rank order (rank 1 first).

    Decode order first: for sub-blocked models the current sub-block's masked positions, then the next
    sub-block's, ...; within a window by descending ``conf`` (ties -> lower position). Without
    sub-blocks the whole block is one window. ``state`` and ``conf`` may be plain lists (``build_drafts``
    has them: a scan of a block's ints in Python costs less than ``nonzero`` and its read).
    """
    state = state.tolist() if isinstance(state, torch.Tensor) else state
    masked = [p for p, x in enumerate(state) if x == mask_id]
    cl = conf.tolist() if isinstance(conf, torch.Tensor) else conf
    if sub_block_size is None:
        return sorted(masked, key=lambda p: (-cl[p], p))
    return sorted(masked, key=lambda p: (p // sub_block_size, -cl[p], p))


def block_finished(state: torch.Tensor | list[int], mask_id: int, need: int, eos_id: int | None,
                   start: int = 0) -> bool:
    """True when the block's output is fully determined.

    The block's generated positions that still count towards ``max_new_tokens`` are ``[start, start +
    need)``; positions before ``start`` hold the prompt's tail (Fast-dLLM v2's first block), never output.
    The block is finished when those positions hold no mask, or (``eos_id`` not None) when one of them
    holds a committed eos at position ``e`` with no mask in ``[start, e]``: everything after it is
    discarded. Positions that no longer matter are never decoded, so this only saves forwards; it never
    changes the output tokens. ``state``: a tensor or a list of ints (the drafts check theirs as lists:
    plain Python on 32 ints costs a few microseconds, a chain of tensor ops on them tens).
    """
    head = state[start:start + need]
    head = head.tolist() if isinstance(head, torch.Tensor) else list(head)
    if mask_id not in head:
        return True
    return eos_id is not None and eos_id in head[:head.index(mask_id)]
