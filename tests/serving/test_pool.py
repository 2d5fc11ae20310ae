"""The KV pool: slot allocation and release, the exhausted-pool error, size checks, prefix views."""
import pytest
import torch

from specfold_compile.testing import tiny_model
from specfold_compile.serving import KVPool, PoolExhausted


def test_allocate_free_and_exhausted():
    pool = KVPool(tiny_model("tiny-nld"), 2, 32)
    a, b = pool.allocate(), pool.allocate()
    assert {a, b} == {0, 1} and pool.free_slots == 0 and pool.used_slots == 2
    with pytest.raises(PoolExhausted, match="pool exhausted: all max_requests=2 slots"):
        pool.allocate()
    pool.free(a)
    assert pool.free_slots == 1 and pool.allocate() == a
    with pytest.raises(ValueError, match="slot: 5 is not an allocated slot"):
        pool.free(5)
    pool.free_all()  # an engine that stopped mid-step leaves its slots; the next one sharing the pool frees them
    assert pool.free_slots == 2 and pool.used_slots == 0 and pool.allocate() == 0


def test_buffers_and_prefix_views():
    model = tiny_model("tiny-fast-dllm-v2")
    cfg = model.config
    pool = KVPool(model, 3, 40)
    assert len(pool.keys) == cfg.num_layers
    assert pool.keys[0].shape == (3, cfg.num_kv_heads, 40, cfg.head_dim)
    assert pool.nbytes() == 2 * cfg.num_layers * 3 * cfg.num_kv_heads * 40 * cfg.head_dim * 4
    slot = pool.allocate()
    with torch.inference_mode():
        cache = model.prefill(torch.arange(32), block_causal=True)
    pool.load(slot, cache.keys, cache.values)
    k, v = pool.prefix(slot, 1)
    assert pool.lengths[slot] == 32 and torch.equal(k, cache.keys[1]) and torch.equal(v, cache.values[1])
    assert k.data_ptr() == pool.keys[1][slot].data_ptr()  # a view, not a copy
    with pytest.raises(ValueError, match="max_tokens_per_request: slot 0 would hold 48 prefix positions"):
        pool.append(slot, 0, k[:, :16], v[:, :16])
    pool.free(slot)
    assert pool.allocate() == slot and pool.lengths[slot] == 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_requests=0, max_tokens_per_request=8), "max_requests: expected an int >= 1, got 0"),
    (dict(max_requests=True, max_tokens_per_request=8), "max_requests: expected an int"),
    (dict(max_requests=1, max_tokens_per_request=-1), "max_tokens_per_request: expected an int >= 0"),
    (dict(max_requests=1, max_tokens_per_request=5000), "max_tokens_per_request: 5000 prefix positions exceed"),
])
def test_sizes_checked(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        KVPool(tiny_model("tiny-nld"), **kwargs)
