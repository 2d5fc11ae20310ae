"""The shared prefix cache and the model's cache passes: prefill, block writes, static caches.

A ``PrefixCache`` holds the prefix's K/V once per layer; every branch of a verification call reads it.
``PrefixCacheMethods`` is the part of ``BlockDiffusionLM`` that fills it: the prompt's prefill, block
writes (dynamic: a new cache each block; static: in place, for CUDA graphs), and the compiled variants
of their tensor work (``compiled_method``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .loop_built import in_loop_built_rows

__all__ = ["PrefixCache", "PrefixCacheMethods", "block_causal_mask", "check_cache_owner"]


@dataclass
class PrefixCache:
    """The shared prefix K/V: one copy per layer, ``[Hkv, P, D]``, read by every branch through views.

    ``next_logits`` ([V]) predicts the token right after the prefix (the next block's seed).
    ``next_block_logits`` ([B, V], or None): the logits of the next block's first state when the pass
    that built this cache verified it too (``prefill`` / ``write_block`` with ``next_block``): what
    ``model(next_block[None], parents=[-1], cache)`` gives, with the family's shift.

    A static cache (``BlockDiffusionLM.static_cache``) has a fixed capacity instead: ``[Hkv, capacity,
    D]`` buffers whose first ``length`` keys are the prefix, the length also held on the device in
    ``device_length`` (int64 [1]), which the verification forward reads (RoPE positions, the attention's
    valid keys). Block writes copy into the buffers in place and update both lengths, so every tensor a
    verification call reads keeps its address and shape from block to block: what a CUDA graph replay
    needs (``decoding.cuda_graphs``).
    """

    keys: list[Tensor]
    values: list[Tensor]
    next_logits: Tensor | None
    owner: int
    device_length: Tensor | None = None  # static caches only
    static_length: int = 0               # static caches only: device_length's value, known to the host
    next_block_logits: Tensor | None = None

    @property
    def length(self) -> int:
        if self.device_length is not None:
            return self.static_length
        return int(self.keys[0].shape[1]) if self.keys else 0

    @property
    def capacity(self) -> int:
        """Keys the buffers hold (= ``length`` for a dynamic cache)."""
        return int(self.keys[0].shape[1]) if self.keys else 0


def check_cache_owner(cache, model_uid: int) -> None:
    """``cache`` is a ``PrefixCache`` built by the model whose ``model_uid`` is given."""
    if not isinstance(cache, PrefixCache):
        raise TypeError(f"cache: expected a PrefixCache from model.prefill, got {type(cache).__name__}")
    if cache.owner != model_uid:
        raise ValueError("cache: this prefix cache was built by another model")


def block_causal_mask(query_positions: Tensor, key_positions: Tensor, block_size: int) -> Tensor:
    """bool [Sq, Sk], True where the query at absolute position q may attend the key at position k:
    k's block ``k // block_size`` is at most q's (bidirectional inside a block, causal across blocks; the
    mask Fast-dLLM v2 is trained with, and its prefill's)."""
    return (key_positions[None, :] // block_size) <= (query_positions[:, None] // block_size)


def _then_next_block(ids: Tensor, positions: Tensor, allowed: Tensor, next_block: Tensor | None
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """A pass over ``ids`` (queries at ``positions``, mask ``allowed`` [S, K]) extended by the next block's
    first state ``next_block`` [B]: its queries at the B positions after the last one, attending to every
    key of the pass (the prefix and ``ids``) and bidirectionally to their own block, as a verification
    call on the cache this pass builds would; ``ids``' queries do not see them. Unchanged for None."""
    if next_block is None:
        return ids, positions, allowed
    s, k = allowed.shape
    b = next_block.shape[0]
    grown = torch.zeros(s + b, k + b, dtype=torch.bool, device=allowed.device)
    grown[:s, :k] = allowed
    grown[s:] = True
    return (torch.cat((ids, next_block)), torch.cat((positions, positions[-1] + 1 + torch.arange(b, device=ids.device))),
            grown)


class PrefixCacheMethods:
    """``BlockDiffusionLM``'s prefill and block writes. Uses the model's ``config``, ``model_uid``,
    ``embed_tokens``, ``head``, ``_param_dtype`` and ``_sequence`` (``sequence.SequenceForward``)."""

    def empty_cache(self, device: torch.device | str | None = None) -> PrefixCache:
        cfg = self.config
        device = device or self.embed_tokens.weight.device
        empty = [torch.empty(cfg.num_kv_heads, 0, cfg.head_dim, dtype=self._param_dtype, device=device)
                 for _ in range(cfg.num_layers)]
        return PrefixCache(empty, [t.clone() for t in empty], None, self.model_uid)

    @torch.no_grad()
    def prefill(self, prompt_ids: Tensor, compiled: bool = False, block_causal: bool = False,
                next_block: Tensor | None = None) -> PrefixCache:
        """One pass over a prompt (1-D int64) into a new prefix cache; the last position's logits predict
        the next token (``next_logits``).

        The mask: causal by default (NLD's prefill). ``block_causal``: the mask Fast-dLLM v2 is trained and
        prefilled with (``block_causal_mask``): bidirectional inside each absolute block ``[kB, kB + B)``,
        causal across blocks; its decoder passes the prompt's whole blocks. An empty prompt gives the
        empty cache (no forward, ``next_logits`` None). ``compiled``: as in ``write_block`` (one graph for
        prompts of any length under each mask). ``next_block``: as in ``write_block``."""
        self.check_prompt(prompt_ids, compiled, block_causal)
        empty = self.empty_cache(prompt_ids.device)
        if prompt_ids.numel() == 0:
            if next_block is not None:
                raise ValueError("next_block: an empty prompt has no prefill to verify it with")
            return empty
        if not block_causal:
            return self.write_block(empty, prompt_ids, causal=True, compiled=compiled, next_block=next_block)
        self.check_next_block(next_block, prompt_ids.numel())
        run = self.prefill_block_causal
        if compiled:
            run = self.compiled_method("prefill_block_causal")
            if prompt_ids.numel() > 1:  # one graph for every prompt length
                torch._dynamo.maybe_mark_dynamic(prompt_ids, 0)
        keys, values, next_logits, block_logits = run(prompt_ids, next_block)
        return PrefixCache(keys, values, next_logits, self.model_uid, next_block_logits=block_logits)

    def check_prompt(self, prompt_ids: Tensor, compiled: bool = False, block_causal: bool = False) -> None:
        """``prefill``'s argument checks (one host read: whether every id lies in the vocabulary)."""
        if not isinstance(prompt_ids, Tensor) or prompt_ids.dim() != 1 or prompt_ids.dtype != torch.int64:
            raise TypeError("prompt_ids: expected a 1-D int64 tensor")
        for name, flag in (("compiled", compiled), ("block_causal", block_causal)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
        self._check_ids("prompt_ids", prompt_ids)
        if prompt_ids.numel() > self.config.max_position_embeddings:
            raise ValueError(f"prompt_ids: {prompt_ids.numel()} tokens exceed "
                             f"max_position_embeddings={self.config.max_position_embeddings}")

    def prefill_block_causal(self, prompt_ids: Tensor, next_block: Tensor | None = None
                             ) -> tuple[list[Tensor], list[Tensor], Tensor, Tensor | None]:
        """``prefill(block_causal=True)``'s tensor work, without checks or host reads (so it compiles):
        prompt_ids [S] -> the per-layer K/V [Hkv, S, D], the last position's logits [V] and (``next_block``
        [B]) that block's logits [B, V] (``write_block``)."""
        s = prompt_ids.shape[0]
        positions = torch.arange(s, device=prompt_ids.device)
        allowed = block_causal_mask(positions, positions, self.config.block_size)
        ids, positions, allowed = _then_next_block(prompt_ids, positions, allowed, next_block)
        h, keys, values = self._sequence(ids[None], positions, allowed[None], None)
        if next_block is not None:
            keys, values = [k[:, :s] for k in keys], [v[:, :s] for v in values]
        return (keys, values, *self._pass_logits(h[0], s, next_block))

    def _pass_logits(self, h: Tensor, s: int, next_block: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """A pass's logits from its final hidden states ``h`` [S (+ B), C]: the last written position's
        [V] and, with ``next_block``, the next block's [B, V] (the family's shift). Without one, ``h``
        is indexed from its end only, so a compiled pass keeps its length dynamic."""
        if next_block is None:
            return self.head(h[-1]), None
        return self.head(h[s - 1]), self.head(self.shift(h[s:]))

    def check_next_block(self, next_block: Tensor | None, end: int, capacity: int | None = None) -> None:
        """``next_block``: None or an int64 [B] state whose B positions after ``end`` fit the model's
        positions (and ``capacity``, a static cache's); its ids are not read here (the decode loop builds it)."""
        if next_block is None:
            return
        b = self.config.block_size
        if not isinstance(next_block, Tensor) or next_block.dtype != torch.int64 or tuple(next_block.shape) != (b,):
            raise TypeError(f"next_block: expected None or an int64 tensor of shape ({b},)")
        limit = self.config.max_position_embeddings if capacity is None else min(capacity,
                                                                                  self.config.max_position_embeddings)
        if end + b > limit:
            raise ValueError(f"next_block: positions up to {end + b} exceed "
                             + ("max_position_embeddings" if capacity is None else "the static cache's capacity")
                             + f" ({limit})")

    @torch.no_grad()
    def static_cache(self, cache: PrefixCache, capacity: int | None = None, out: PrefixCache | None = None
                     ) -> PrefixCache:
        """``cache``'s prefix in a static cache (``PrefixCache``): new buffers of ``capacity`` keys, or
        copied into the static cache ``out`` in place (its buffers, device length and so any CUDA graph
        captured on it stay valid). Capacity beyond the prefix is for the blocks ``write_block`` adds."""
        if not isinstance(cache, PrefixCache) or cache.owner != self.model_uid:
            raise TypeError("cache: expected a PrefixCache of this model (from model.prefill)")
        length = cache.length
        if out is None:
            if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < max(length, 1):
                raise ValueError(f"capacity: expected an int >= the prefix length {max(length, 1)}, got {capacity!r}")
            dev = cache.keys[0].device
            shape = (self.config.num_kv_heads, capacity, self.config.head_dim)
            out = PrefixCache([cache.keys[0].new_zeros(shape) for _ in cache.keys],
                              [cache.values[0].new_zeros(shape) for _ in cache.values], None, self.model_uid,
                              torch.zeros(1, dtype=torch.int64, device=dev), 0)
        elif not isinstance(out, PrefixCache) or out.device_length is None or out.owner != self.model_uid:
            raise TypeError("out: expected a static PrefixCache of this model (from model.static_cache)")
        elif out.capacity < length:
            raise ValueError(f"out: capacity {out.capacity} is below the prefix length {length}")
        for buf, src in zip((*out.keys, *out.values), (*cache.keys, *cache.values)):
            buf[:, :length].copy_(src[:, :length])
        out.device_length.fill_(length)
        out.static_length, out.next_logits = length, cache.next_logits
        return out

    @torch.no_grad()
    def write_block(self, cache: PrefixCache, block_tokens: Tensor, causal: bool | None = None,
                    compiled: bool = False, next_block: Tensor | None = None) -> PrefixCache:
        """Append a finished block to the prefix cache (returns a new cache; a static cache is updated in
        place and returned: its buffers keep their addresses).

        Fast-dLLM v2 writes the block attending bidirectionally to itself; NLD writes it causally.
        The last position's logits become ``next_logits`` (the next block's seed).
        ``compiled``: run the tensor work (``append_block``, or ``append_block_static`` on a static
        cache) through ``torch.compile`` with its default backend (compiled on first use and kept; on a
        dynamic cache one graph for prompts and one for block writes, each dynamic in its length;
        gpt-fast's ``compile_prefill``). The checks here stay eager.

        ``next_block`` (int64 [B], or None): the next block's first state, verified in the same pass
        (block-boundary fusion, ``generate(fuse_boundaries=True)``): its rows sit after the written block,
        attend to the whole new prefix and bidirectionally to themselves, and are not written; their
        logits land in the returned cache's ``next_block_logits`` (what ``model(next_block[None], [-1],
        returned cache)`` gives). A static cache needs room for those B keys past the block too.
        """
        p, s, causal = self.check_block(cache, block_tokens, causal, compiled)
        static = cache.device_length is not None
        self.check_next_block(next_block, p + s, cache.capacity if static else None)
        if static:
            append_static = self.compiled_method("append_block_static") if compiled else self.append_block_static
            cache.next_logits, cache.next_block_logits = append_static(cache.keys, cache.values, cache.device_length,
                                                                       block_tokens, causal, next_block)
            cache.static_length = p + s
            return cache
        append = self.append_block
        if compiled:
            append = self.compiled_method("append_block")
            # Lengths change every call: trace them as dynamic from the start (one graph for prompts,
            # P = 0, dynamic S; one for blocks, dynamic P) instead of recompiling on the second size.
            if s > 1 and p == 0:
                torch._dynamo.maybe_mark_dynamic(block_tokens, 0)
            if p > 1:
                for t in (*cache.keys, *cache.values):
                    torch._dynamo.maybe_mark_dynamic(t, 1)
        keys, values, next_logits, block_logits = append(cache.keys, cache.values, block_tokens, causal, next_block)
        return PrefixCache(keys, values, next_logits, self.model_uid, next_block_logits=block_logits)

    def check_block(self, cache: PrefixCache, block_tokens: Tensor, causal: bool | None = None,
                    compiled: bool = False) -> tuple[int, int, bool]:
        """``write_block``'s argument checks (one host read, the ids' range, skipped inside
        ``checks.loop_built_rows()``); returns the prefix length, the block length and ``causal`` resolved
        from the family when None."""
        if not isinstance(block_tokens, Tensor) or block_tokens.dim() != 1 or block_tokens.dtype != torch.int64:
            raise TypeError("block_tokens: expected a 1-D int64 tensor")
        check_cache_owner(cache, self.model_uid)
        if not isinstance(compiled, bool):
            raise TypeError(f"compiled: expected a bool, got {type(compiled).__name__}")
        if causal is None:
            causal = self.config.family == "nld"
        s, p = block_tokens.shape[0], cache.length
        if p + s > self.config.max_position_embeddings:
            raise ValueError(f"block_tokens: prefix length {p} + {s} tokens exceeds "
                             f"max_position_embeddings={self.config.max_position_embeddings}")
        if cache.device_length is not None and p + s > cache.capacity:
            raise ValueError(f"block_tokens: prefix length {p} + {s} tokens exceeds the static cache's capacity "
                             f"{cache.capacity}")
        if not in_loop_built_rows():
            self._check_ids("block_tokens", block_tokens)
        return p, s, bool(causal)

    def _check_ids(self, name: str, ids: Tensor) -> None:
        """Every id of ``ids`` in the vocabulary (one host read, none for an empty tensor)."""
        if ids.numel() and bool(((ids < 0) | (ids >= self.config.vocab_size)).any()):
            raise ValueError(f"{name}: ids must lie in [0, {self.config.vocab_size})")

    def append_block(self, keys: list[Tensor], values: list[Tensor], block_tokens: Tensor, causal: bool,
                     next_block: Tensor | None = None
                     ) -> tuple[list[Tensor], list[Tensor], Tensor, Tensor | None]:
        """``write_block``'s tensor work, without checks or host reads (so it compiles and graph-captures):
        per-layer prefix K/V [Hkv, P, D] and block_tokens [S] -> the K/V [Hkv, P+S, D], the last
        position's logits [V] and (``next_block`` [B]) that block's logits [B, V]."""
        s, p = block_tokens.shape[0], keys[0].shape[1]
        device = block_tokens.device
        allowed = torch.ones(s, p + s, dtype=torch.bool, device=device)
        if causal:
            allowed[:, p:] = torch.ones(s, s, dtype=torch.bool, device=device).tril()
        positions = torch.arange(s, device=device) + p
        ids, positions, allowed = _then_next_block(block_tokens, positions, allowed, next_block)
        h, keys, values = self._sequence(ids[None], positions, allowed[None], (keys, values))
        if next_block is not None:
            keys, values = [k[:, :p + s] for k in keys], [v[:, :p + s] for v in values]
        return (keys, values, *self._pass_logits(h[0], s, next_block))

    def append_block_static(self, keys: list[Tensor], values: list[Tensor], device_length: Tensor,
                            block_tokens: Tensor, causal: bool, next_block: Tensor | None = None
                            ) -> tuple[Tensor, Tensor | None]:
        """``append_block`` on a static cache's buffers [Hkv, capacity, D], in place: each layer writes the
        block's K/V at ``device_length`` and attends over the whole buffers with the keys past the block
        masked; ``device_length`` then advances by S; returns the last position's logits [V] and
        (``next_block`` [B]) that block's logits [B, V] (its K/V go to the B keys past the block, beyond
        the new length: scratch that the next write overwrites). No host reads and shapes that do not
        depend on the prefix length, so one CUDA graph serves every block write of a decode loop
        (``VerifyGraphs.write_block``), and the prefix is never copied (the dynamic cache's ``torch.cat``
        copies it once a block)."""
        s, capacity = block_tokens.shape[0], keys[0].shape[1]
        device = block_tokens.device
        positions = device_length + torch.arange(s, device=device)  # the block's keys and RoPE positions
        key_index = torch.arange(capacity, device=device)
        if causal:
            allowed = key_index[None, :] <= positions[:, None]
        else:
            allowed = (key_index < device_length + s)[None, :].expand(s, capacity)
        ids = block_tokens
        if next_block is not None:  # its rows see every key up to the end of their own block
            b = next_block.shape[0]
            ids = torch.cat((block_tokens, next_block))
            positions = device_length + torch.arange(s + b, device=device)
            allowed = torch.cat((allowed, (key_index < device_length + s + b)[None, :].expand(b, capacity)))
        h, _, _ = self._sequence(ids[None], positions, allowed[None], (keys, values), write_at=positions)
        device_length.add_(s)
        return self._pass_logits(h[0], s, next_block)

    def prefill_static(self, keys: list[Tensor], values: list[Tensor], device_length: Tensor, ids: Tensor,
                       prompt_length: Tensor, block_causal: bool, next_rows: int = 0) -> tuple[Tensor, Tensor | None]:
        """``prefill`` into a static cache's buffers [Hkv, capacity, D], in place, with shapes that depend
        on the padded row count only (one CUDA graph serves every prompt padded to it:
        ``VerifyGraphs.prefill``). ``ids`` [S]: the prompt's L tokens (L = ``prompt_length`` [1], on the
        device), then ``next_rows`` (0 or B) tokens of the next block's first state (verified in the same
        pass, as ``prefill(next_block=...)``), then padding. Every row's K/V is written at its position
        (the rows past L are scratch that later writes overwrite); the prompt's rows attend to the prompt
        only (block-causal or causal), the next block's to the prompt and to themselves, the padding's to
        what precedes it (never read). ``device_length`` becomes L. Returns the logits of position L - 1
        [V] and (``next_rows``) the next block's [B, V], with the family's shift."""
        s, capacity = ids.shape[0], keys[0].shape[1]
        device = ids.device
        positions = torch.arange(s, device=device)
        key_index = torch.arange(capacity, device=device)
        if block_causal:
            prompt_mask = block_causal_mask(positions, key_index, self.config.block_size)
        else:
            prompt_mask = key_index[None, :] <= positions[:, None]
        prompt_mask = prompt_mask & (key_index < prompt_length)[None, :]
        is_prompt = (positions < prompt_length)[:, None]
        is_next = (positions < prompt_length + next_rows)[:, None]
        allowed = torch.where(is_prompt, prompt_mask,
                              torch.where(is_next, (key_index < prompt_length + next_rows)[None, :],
                                          key_index[None, :] <= positions[:, None]))
        h, _, _ = self._sequence(ids[None], positions, allowed[None], (keys, values), write_at=positions)
        device_length.copy_(prompt_length)
        last = h[0].index_select(0, prompt_length - 1)[0]
        if not next_rows:
            return self.head(last), None
        block = h[0].index_select(0, prompt_length + torch.arange(next_rows, device=device))
        return self.head(last), self.head(self.shift(block))

    def compiled_method(self, name: str):
        """The method ``name`` under ``torch.compile`` (default backend), made on first use and kept out of
        the module's state: what ``write_block(compiled=True)`` runs."""
        compiled = self.__dict__.setdefault("_compiled_methods", {})
        if name not in compiled:
            compiled[name] = torch.compile(getattr(self, name))
        return compiled[name]
