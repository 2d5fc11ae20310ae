"""The batched passes equal each request's batch-1 pass bit for bit (CPU, float32): the verification
forward's final hidden states and logits, the block writes' K/V and next-block logits, on both families,
for random prefixes and branch counts (why: ``serving.forward``'s docstring)."""
import contextlib

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfold_compile.testing import TINY_FAMILIES as FAMILIES, identity_head, tiny_model
from specfold_compile.serving.forward import verify_batch, write_blocks
from specfold_compile.serving.pool import KVPool

HSET = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _prefilled(model, pool, lengths, gen):
    caches, slots = [], []
    vocab = model.config.vocab_size
    for length in lengths:
        prompt = torch.randint(0, vocab, (length,), generator=gen)
        cache = model.prefill(prompt) if length else model.empty_cache()
        slot = pool.allocate()
        pool.load(slot, cache.keys, cache.values)
        caches.append(cache)
        slots.append(slot)
    return caches, slots


@settings(max_examples=12, **HSET)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**16),
       lengths=st.lists(st.integers(0, 40), min_size=1, max_size=4),
       counts=st.lists(st.integers(1, 5), min_size=4, max_size=4))
def test_verify_batch_is_each_request_alone(family, seed, lengths, counts):
    model = tiny_model(family)
    block, mask = model.config.block_size, model.config.mask_token_id
    gen = torch.Generator().manual_seed(seed)
    pool = KVPool(model, 4, 64)
    with torch.inference_mode():
        caches, slots = _prefilled(model, pool, lengths, gen)
        rows, positions = [], []
        for n in counts[:len(lengths)]:
            r = torch.randint(0, model.config.vocab_size, (n, block), generator=gen)
            r[torch.rand(n, block, generator=gen) < 0.5] = mask
            rows.append(r)
            positions.append((r == mask).flatten().nonzero().flatten())
        for head in (False, True):
            with contextlib.nullcontext() if head else identity_head(model):
                batched = verify_batch(model, pool, slots, rows, positions)
                for r, p, cache, got in zip(rows, positions, caches, batched):
                    parents = torch.tensor([-1] + [0] * (r.shape[0] - 1))
                    alone = model(r, parents, cache, logit_positions=p)
                    if not head:  # the final hidden states
                        assert got.shape == (p.numel(), model.config.hidden_size)
                    assert torch.equal(got, alone)  # bit for bit


@settings(max_examples=12, **HSET)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**16),
       lengths=st.lists(st.integers(0, 40), min_size=1, max_size=3), writes=st.integers(1, 2))
def test_write_blocks_is_each_request_alone(family, seed, lengths, writes):
    model = tiny_model(family)
    gen = torch.Generator().manual_seed(seed)
    pool = KVPool(model, 3, 40 + 2 * model.config.block_size)
    with torch.inference_mode():
        caches, slots = _prefilled(model, pool, lengths, gen)
        for _ in range(writes):
            blocks = [torch.randint(0, model.config.vocab_size, (model.config.block_size,), generator=gen)
                      for _ in slots]
            next_logits = write_blocks(model, pool, slots, blocks)
            for i, (slot, block) in enumerate(zip(slots, blocks)):
                caches[i] = model.write_block(caches[i], block)
                assert torch.equal(next_logits[i], caches[i].next_logits)
                assert pool.lengths[slot] == caches[i].length
                for layer in range(model.config.num_layers):
                    k, v = pool.prefix(slot, layer)
                    assert torch.equal(k, caches[i].keys[layer]) and torch.equal(v, caches[i].values[layer])
