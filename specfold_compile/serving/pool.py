"""The pooled prefix KV store of the serving engine: a fixed number of request slots, each with room for
a fixed number of prefix positions, one K and one V buffer per layer shared by every slot.

``KVPool(model, max_requests, max_tokens_per_request)`` allocates ``[max_requests, Hkv,
max_tokens_per_request, D]`` per layer, K and V, once. A request takes a slot (``allocate``), gets its
prompt's prefill copied in (``load``), has its finished blocks appended (``append``, then ``advance``)
and gives the slot back when it finishes or is aborted (``free``). The verification forward reads a
slot's prefix as views of the buffers (``prefix``): the first ``length`` positions, never copied.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KVPool", "PoolExhausted", "check_pool_size"]


class PoolExhausted(RuntimeError):
    """Every slot of the pool (or every place in the engine's queue) is taken."""


def _check_count(name: str, value, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int >= {lo}, got {type(value).__name__}")
    if value < lo:
        raise ValueError(f"{name}: expected an int >= {lo}, got {value}")
    return value


def check_pool_size(max_requests, max_tokens_per_request, max_positions: int) -> None:
    """The pool's two sizes: at least one slot, and at most the model's position limit of prefix positions
    a slot (a one-line error naming the argument otherwise)."""
    _check_count("max_requests", max_requests, 1)
    _check_count("max_tokens_per_request", max_tokens_per_request, 0)
    if max_tokens_per_request > max_positions:
        raise ValueError(f"max_tokens_per_request: {max_tokens_per_request} prefix positions exceed the model's "
                         f"max_position_embeddings={max_positions}")


class KVPool:
    """Per-layer K/V buffers ``[max_requests, Hkv, max_tokens_per_request, D]`` (module docstring).

    ``spare_slot``: one more slot in the buffers, ``spare``, never handed out: the padding of a CUDA-graph
    replay writes its blocks there (``graphs.BatchGraphs``); None without it."""

    def __init__(self, model, max_requests: int, max_tokens_per_request: int, spare_slot: bool = False):
        cfg = model.config
        check_pool_size(max_requests, max_tokens_per_request, int(cfg.max_position_embeddings))
        weight = model.embed_tokens.weight
        shape = (max_requests + int(spare_slot), cfg.num_kv_heads, max_tokens_per_request, cfg.head_dim)
        self.spare = max_requests if spare_slot else None
        self.keys: list[Tensor] = [weight.new_zeros(shape) for _ in range(cfg.num_layers)]
        self.values: list[Tensor] = [weight.new_zeros(shape) for _ in range(cfg.num_layers)]
        self.max_requests = max_requests
        self.device = weight.device
        self.capacity = max_tokens_per_request
        self.lengths = [0] * max_requests
        self._free = list(range(max_requests))
        self._used: set[int] = set()

    # --- slots ------------------------------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def used_slots(self) -> int:
        return len(self._used)

    def allocate(self) -> int:
        """A free slot, emptied (length 0); ``PoolExhausted`` when every slot is in use."""
        if not self._free:
            raise PoolExhausted(f"pool exhausted: all max_requests={self.max_requests} slots hold a request "
                                "(free one by finishing or aborting a request, or make the pool larger)")
        slot = self._free.pop(0)
        self._used.add(slot)
        self.lengths[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        """Give ``slot`` back (its buffers keep their stale contents; the next ``allocate`` resets it)."""
        self._check_slot(slot)
        self._used.remove(slot)
        self._free.append(slot)
        self._free.sort()
        self.lengths[slot] = 0

    def free_all(self) -> None:
        """Give every slot back: the pool of an engine that stopped mid-step (out of memory, say), for the
        next engine that shares it."""
        for slot in sorted(self._used):
            self.free(slot)

    def _check_slot(self, slot: int) -> None:
        if slot not in self._used:
            raise ValueError(f"slot: {slot!r} is not an allocated slot of this pool")

    # --- contents ---------------------------------------------------------------------------------
    def load(self, slot: int, keys: list[Tensor], values: list[Tensor]) -> None:
        """Copy a prefix (per-layer ``[Hkv, P, D]``, a ``PrefixCache``'s keys and values) into ``slot``."""
        self._check_slot(slot)
        length = int(keys[0].shape[1]) if keys else 0
        self._check_room(slot, length, 0)
        for buf, src in zip((*self.keys, *self.values), (*keys, *values)):
            buf[slot, :, :length].copy_(src)
        self.lengths[slot] = length

    def _check_room(self, slot: int, extra: int, length: int) -> None:
        if length + extra > self.capacity:
            raise ValueError(f"max_tokens_per_request: slot {slot} would hold {length + extra} prefix positions, "
                             f"beyond the pool's {self.capacity}")

    def prefix(self, slot: int, layer: int) -> tuple[Tensor, Tensor]:
        """``slot``'s prefix K and V of ``layer``: views ``[Hkv, length, D]`` of the pool's buffers."""
        length = self.lengths[slot]
        return self.keys[layer][slot, :, :length], self.values[layer][slot, :, :length]

    def device_lengths(self, slots: list[int]) -> Tensor:
        """The prefix lengths of ``slots`` as an int32 tensor ``[len(slots)]`` on the pool's device (what
        the ragged attention kernel loads; made from the host-side lengths, no read back)."""
        for slot in slots:
            self._check_slot(slot)
        return torch.tensor([self.lengths[s] for s in slots], dtype=torch.int32, device=self.device)

    def append(self, slot: int, layer: int, k: Tensor, v: Tensor) -> None:
        """Write a block's K and V (``[Hkv, S, D]``) of ``layer`` right after ``slot``'s prefix; the length
        moves on once every layer is written (``advance``)."""
        length, s = self.lengths[slot], int(k.shape[1])
        self._check_room(slot, s, length)
        self.keys[layer][slot, :, length:length + s].copy_(k)
        self.values[layer][slot, :, length:length + s].copy_(v)

    def advance(self, slot: int, s: int) -> None:
        self._check_slot(slot)
        self._check_room(slot, s, self.lengths[slot])
        self.lengths[slot] += s

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def __repr__(self) -> str:
        return (f"KVPool(max_requests={self.max_requests}, max_tokens_per_request={self.capacity}, "
                f"used={self.used_slots}, {self.nbytes() / 2**20:.1f} MiB)")

