"""Block boundaries of a decode loop: a block's first state, and the passes that write a prefix (the
prompt's prefill, a finished block's write), which with ``generate(fuse_boundaries=True)`` also verify
the next block's first state (docs/SPEC.md, fused block boundaries; ``fuse_boundaries="writes"``: the
block writes only). Shared by the Python loop (``decoder``) and the device loop (``device_loop``), so both
fuse the same boundaries."""

from __future__ import annotations

import torch

from ..models.checks import loop_built_rows
from .commit import block_finished, next_token

__all__ = ["first_state", "seed_guess", "prefill", "write", "confirmed", "check_fuse_boundaries", "fuses_prefill"]

Verified = tuple[torch.Tensor, torch.Tensor] | None  # (a first state [B], its logits [B, V])


def check_fuse_boundaries(value) -> None:
    """``generate(fuse_boundaries=value)``: False (every step its own call), True (the prefill and the block
    writes verify the block after them) or ``"writes"`` (the block writes only; the prefill stays a pass
    of its own); a one-line error naming the argument otherwise."""
    if not (isinstance(value, bool) or (isinstance(value, str) and value == "writes")):
        raise ValueError(f"fuse_boundaries: expected False, True or 'writes', got {value!r}")


def fuses_prefill(value) -> bool:
    """Whether ``fuse_boundaries=value`` has the prompt's prefill verify the first block."""
    return value is True


def first_state(head: list[int], cache, B: int, mask_id: int) -> torch.Tensor:
    """A block's first state: the prompt's fixed tail, or position 0 the seed (the argmax of the logits
    of the pass that wrote the prefix before it), the rest masked."""
    X = torch.full((B,), mask_id, dtype=torch.long)
    X[:len(head)] = torch.tensor(head, dtype=torch.long)
    if not head:
        X[0] = int(next_token(cache.next_logits, mask_id))
    return X


def seed_guess(model, steps_done: bool, guess: int, mask_id: int, need: int, eos, B: int) -> torch.Tensor | None:
    """The next block's first state to verify with the block write, or None: its seed guessed as the last
    call's prediction of the block's next token (position 0's logits under the Fast-dLLM shift; a family
    without the shift has no such prediction), and only when that state still has something to decode."""
    if not steps_done or not model.config.shift_logits or guess == mask_id:
        return None
    X = torch.full((B,), mask_id, dtype=torch.long)
    X[0] = guess
    return None if block_finished(X, mask_id, need, eos, 0) else X


def prefill(model, layout, writes: dict, fuse: bool, B: int, mask_id: int, device, graphs=None,
            needed: int = 0) -> tuple[object, Verified]:
    """The prompt's prefill; with ``fuse``, a first block that holds the prompt's tail (its first state
    needs no seed) is verified in the same pass. With ``graphs`` (a ``VerifyGraphs``) the cache is its
    static cache, with room for ``needed`` keys: the prefill replayed into it (``capture_prefill``), or
    launched and copied in (``attach``)."""
    first = None
    if fuse and layout.head and layout.prefill_ids.numel():
        first = first_state(layout.head, None, B, mask_id)
    nxt = None if first is None else first.to(device)
    replayed = graphs is not None and graphs.capture_prefill
    if replayed:
        cache = graphs.prefill(layout.prefill_ids, needed, layout.block_causal, bool(writes.get("compiled")), nxt)
    else:
        kwargs = dict(writes, block_causal=True) if layout.block_causal else writes
        cache = model.prefill(layout.prefill_ids, **kwargs, **({} if nxt is None else {"next_block": nxt}))
    verified = None if first is None else (first, cache.next_block_logits)
    if graphs is not None and not replayed:
        cache = graphs.attach(cache, needed)
    return cache, verified


def write(model, cache, block: torch.Tensor, graphs, compile_writes: bool, next_block: torch.Tensor | None,
          device) -> tuple[object, Verified]:
    """A finished block's write (replayed or launched in place through ``graphs`` when given), verifying
    ``next_block`` (or None) in the same pass. ``block`` (on the host or the device) holds the loop's own
    tokens: written inside ``loop_built_rows()``, which skips the check of their ids (a host read)."""
    fuse = {} if next_block is None else {"next_block": next_block.to(device)}
    with loop_built_rows():
        if graphs is not None:
            cache = graphs.write_block(cache, block.to(device), compile_writes, **fuse)
        else:
            cache = model.write_block(cache, block.to(device), **({"compiled": True} if compile_writes else {}),
                                      **fuse)
    return cache, None if next_block is None else (next_block, cache.next_block_logits)


def confirmed(verified: Verified, state: torch.Tensor) -> Verified:
    """``verified`` when it is of ``state`` (the block's real first state), else None: a wrong guess of
    the seed, whose logits are of another state and are dropped (the block's first call runs)."""
    return verified if verified is not None and torch.equal(verified[0], state) else None
