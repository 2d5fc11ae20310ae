"""The batched passes with ragged attention (one launch a layer over every request's rows, each against its
own pool slot) give the per-request path's logits and K/V to float32 tolerance on both families, and the
engine decodes the same tokens either way."""
import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfold_compile.serving import Engine, RequestParams
from specfold_compile.serving.forward import attend_requests, request_rows, verify_batch, write_blocks
from specfold_compile.serving.pool import KVPool
from specfold_compile.testing import TINY_FAMILIES as FAMILIES, assert_close, prefilled_slots, tiny_model

HSET = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=4)


def _pool_with_prefixes(model, lengths, gen, extra=0):
    """A pool with one slot more than requests (the requests' slots are not 0..n-1 in order), each request's
    prompt prefilled into its slot."""
    pool = KVPool(model, len(lengths) + 1, 40 + extra)
    return pool, prefilled_slots(pool, model, lengths, gen)


@settings(**HSET)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**16),
       lengths=st.lists(st.integers(0, 40), min_size=1, max_size=4),
       counts=st.lists(st.integers(1, 4), min_size=4, max_size=4))
def test_verify_batch_ragged_is_per_request(family, seed, lengths, counts):
    model = tiny_model(family)
    block, mask = model.config.block_size, model.config.mask_token_id
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        pool, slots = _pool_with_prefixes(model, lengths, gen)
        rows, positions = [], []
        for n in counts[:len(lengths)]:
            r = torch.randint(0, model.config.vocab_size, (n, block), generator=gen)
            r[torch.rand(n, block, generator=gen) < 0.5] = mask
            rows.append(r)
            positions.append(torch.arange(n * block))
        per_request = verify_batch(model, pool, slots, rows, positions)
        ragged = verify_batch(model, pool, slots, rows, positions, attention="ragged")
    for a, b in zip(per_request, ragged):
        assert a.shape == b.shape
        assert_close(b, a, what=family)


@settings(**HSET)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**16),
       lengths=st.lists(st.integers(0, 40), min_size=1, max_size=3))
def test_write_blocks_ragged_is_per_request(family, seed, lengths):
    """Bidirectional (Fast-dLLM v2) and causal (NLD) block writes: the next-block logits and the K/V
    appended to every slot."""
    model = tiny_model(family)
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        pool, slots = _pool_with_prefixes(model, lengths, gen, extra=model.config.block_size)
        twin = copy.deepcopy(pool)
        blocks = [torch.randint(0, model.config.vocab_size, (model.config.block_size,), generator=gen)
                  for _ in slots]
        per_request = write_blocks(model, pool, slots, blocks)
        ragged = write_blocks(model, twin, slots, blocks, attention="ragged")
    for a, b in zip(per_request, ragged):
        assert_close(b, a, what=family)
    assert pool.lengths == twin.lengths
    for layer in range(model.config.num_layers):
        for slot in slots:
            for a, b in zip(pool.prefix(slot, layer), twin.prefix(slot, layer)):
                assert_close(b, a, what=f"{family} layer {layer} slot {slot}")


def test_attend_requests_ragged_needs_device_rows():
    model = tiny_model(FAMILIES[0])
    pool, slots = _pool_with_prefixes(model, [3], torch.Generator().manual_seed(0))
    cfg = model.config
    q = torch.randn(1, cfg.block_size, cfg.num_heads, cfg.head_dim)
    k = torch.randn(1, cfg.block_size, cfg.num_kv_heads, cfg.head_dim)
    with pytest.raises(ValueError, match="^rows: attention='ragged' needs"):
        attend_requests(q, k, k, pool, 0, request_rows(pool, slots, [1]), 0.25, "ragged")


@pytest.mark.parametrize("where", ["verify_batch", "write_blocks", "Engine", "request_rows"])
def test_unknown_attention_is_refused(where):
    model = tiny_model(FAMILIES[0])
    pool, slots = _pool_with_prefixes(model, [3], torch.Generator().manual_seed(0))
    row = torch.zeros(1, model.config.block_size, dtype=torch.int64)
    call = {"verify_batch": lambda: verify_batch(model, pool, slots, [row], [torch.arange(2)], attention="flash"),
            "write_blocks": lambda: write_blocks(model, pool, slots, [row[0]], attention="flash"),
            "Engine": lambda: Engine(model, attention="flash"),
            "request_rows": lambda: request_rows(pool, slots, [1], "flash")}[where]
    expected = "'auto' or one of" if where == "Engine" else "one of"
    with pytest.raises(ValueError, match=rf"^attention: expected {expected} \('per_request', 'ragged'\), got 'flash'"):
        call()


def test_the_engines_auto_attention_follows_the_device_alone():
    from specfold_compile.serving.forward import engine_attention

    assert engine_attention("auto", torch.device("cuda", 0)) == "ragged"
    assert engine_attention("auto", torch.device("cpu")) == "per_request"
    assert engine_attention("ragged", torch.device("cpu")) == "ragged"
    assert Engine(tiny_model(FAMILIES[0])).attention == "per_request"  # the CPU: bit for bit batch-1


@pytest.mark.parametrize("family, mode", [(FAMILIES[0], "spiffy"), (FAMILIES[1], "vanilla")])
def test_engine_ragged_decodes_the_same_tokens(family, mode):
    model = tiny_model(family)
    params = [RequestParams(max_new_tokens=n, stop_at_eos=False) for n in (16, 5, 24)]
    prompts = [torch.randint(0, 90, (n,), generator=torch.Generator().manual_seed(n)) for n in (7, 12, 3)]
    tokens = {}
    for attention in ("per_request", "ragged"):
        engine = Engine(model, max_requests=2, max_tokens_per_request=96, mode=mode, attention=attention)
        ids = [engine.add_request(p, r) for p, r in zip(prompts, params)]
        list(engine.run())
        tokens[attention] = [engine.output(i).result.tokens for i in ids]
        assert all(engine.output(i).status == "finished" for i in ids)
    assert tokens["ragged"] == tokens["per_request"]
