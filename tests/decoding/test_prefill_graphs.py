"""The prompt's prefill replayed into the static cache (``VerifyGraphs.prefill``, ``model.prefill_static``).

On the CPU the graphs are replayed eagerly (``replay="eager"``): the same buffers, padding and one entry
per padded row count; the CUDA case captures and replays for real."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specfold_compile.decoding import VerifyGraphs, generate
from specfold_compile.decoding.cuda_graphs import prefill_rows_bucket


def test_prefill_rows_bucket():
    assert [prefill_rows_bucket(r) for r in (1, 16, 17, 33, 65, 129, 300, 1000)] == [16, 16, 32, 48, 80, 160, 320,
                                                                                       1024]
    for rows in range(1, 3000):
        padded = prefill_rows_bucket(rows)
        assert rows <= padded < rows + max(16, rows / 4)
        assert padded % 16 == 0
    assert len({prefill_rows_bucket(r) for r in range(1025, 2049)}) == 4  # four graphs per doubling
    with pytest.raises(ValueError, match="rows: expected >= 1"):
        prefill_rows_bucket(0)


def _junk(cache, seed):
    """Random values everywhere past the cache's length: the next prefill may read none of them."""
    g = torch.Generator().manual_seed(seed)
    for buf in (*cache.keys, *cache.values):
        buf[:, cache.length:] = torch.randn(buf[:, cache.length:].shape, generator=g)


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_replayed_prefill_matches_the_launched_prefill(model, data):
    """Prompt after prompt on one static cache (junk left past each prefix): the prefix's K/V, the length
    and the logits of the launched prefill, under either mask, with and without a verified next block."""
    B, V = model.config.block_size, model.config.vocab_size
    graphs = VerifyGraphs(model, replay="eager")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    shapes = set()  # one buffer allocation here (capacity 257) and one window: the graphs' keys
    for i in range(data.draw(st.integers(1, 3), label="prompts")):
        length = data.draw(st.integers(0, 3 * B + 5), label="length")
        block_causal = data.draw(st.booleans(), label="block_causal")
        fused = length > 0 and data.draw(st.booleans(), label="fused")
        ids = torch.randint(0, V, (length,), generator=g)
        nxt = torch.randint(0, V, (B,), generator=g) if fused else None
        want = model.prefill(ids, block_causal=block_causal, **({"next_block": nxt} if fused else {}))
        if graphs.cache is not None:
            _junk(graphs.cache, i)
        got = graphs.prefill(ids, length + 2 * B, block_causal, next_block=nxt)
        assert got is graphs.cache and got.length == length and int(got.device_length) == length
        assert got.capacity - 1 >= length + 2 * B
        for buf, ref in zip((*got.keys, *got.values), (*want.keys, *want.values)):
            torch.testing.assert_close(buf[:, :length], ref)
        if length == 0:
            assert got.next_logits is None and want.next_logits is None
            continue
        shapes.add((prefill_rows_bucket(length + (B if fused else 0)), block_causal, fused))
        torch.testing.assert_close(got.next_logits, want.next_logits)
        if fused:
            torch.testing.assert_close(got.next_block_logits, want.next_block_logits)
        else:
            assert got.next_block_logits is None
    assert graphs.prefill_captures == len(shapes)  # one graph per padded row count, mask and fusion


def test_generate_replays_the_prefill_once_captured(model):
    """The second decode of a prompt of the same bucket replays the first one's prefill graph; with
    ``capture_prefill=False`` the prefill is launched and copied in, the same tokens."""
    p = torch.arange(3, 45) % model.config.vocab_size
    graphs = VerifyGraphs(model, replay="eager")
    first = generate(model, p, mode="spiffy", max_new_tokens=40, draft_budget=8, cuda_graphs=graphs)
    assert graphs.prefill_captures == 1 and graphs.prefill_replays == 0
    # Fast-dLLM v2 prefills the prompt's whole block (32 of 42 and of 41 tokens), NLD all of it (48 rows)
    again = generate(model, p[1:], mode="spiffy", max_new_tokens=40, draft_budget=8, cuda_graphs=graphs)
    assert graphs.prefill_captures == 1 and graphs.prefill_replays == 1
    launched = VerifyGraphs(model, replay="eager", capture_prefill=False)
    assert generate(model, p, mode="spiffy", max_new_tokens=40, draft_budget=8, cuda_graphs=launched).tokens \
        == first.tokens
    assert generate(model, p[1:], mode="spiffy", max_new_tokens=40, draft_budget=8, cuda_graphs=launched).tokens \
        == again.tokens
    assert launched.prefill_captures == launched.prefill_replays == 0


def test_prefill_bad_inputs(model):
    graphs = VerifyGraphs(model, replay="eager")
    V, B = model.config.vocab_size, model.config.block_size
    with pytest.raises(TypeError, match="capture_prefill: expected a bool"):
        VerifyGraphs(model, capture_prefill=1)
    with pytest.raises(ValueError, match=r"prompt_ids: ids must lie in \[0, "):
        graphs.prefill(torch.tensor([1, V]), 64)
    with pytest.raises(TypeError, match="prompt_ids: expected a 1-D int64 tensor"):
        graphs.prefill(torch.tensor([[1, 2]]), 64)
    with pytest.raises(ValueError, match="next_block: an empty prompt"):
        graphs.prefill(torch.zeros(0, dtype=torch.long), 64, next_block=torch.zeros(B, dtype=torch.long))
    with pytest.raises(TypeError, match="next_block: expected None or an int64 tensor"):
        graphs.prefill(torch.tensor([1, 2]), 64, next_block=torch.zeros(B - 1, dtype=torch.long))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures CUDA graphs")
def test_captured_prefill_matches_the_launched_prefill_on_cuda(model):
    model = model.cuda()
    B, V = model.config.block_size, model.config.vocab_size
    graphs = VerifyGraphs(model)
    g = torch.Generator().manual_seed(0)
    for length in (40, 37, 64, 40):  # the repeats replay
        ids = torch.randint(0, V, (length,), generator=g).cuda()
        want = model.prefill(ids, block_causal=True)
        got = graphs.prefill(ids, length + B, True)
        for buf, ref in zip((*got.keys, *got.values), (*want.keys, *want.values)):
            torch.testing.assert_close(buf[:, :length], ref, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.next_logits, want.next_logits, atol=1e-4, rtol=1e-4)
    assert graphs.prefill_replays >= 1


def test_compiled_prefill_compiles_once_for_every_bucket(model):
    """``compiled=True`` (``generate(compile_writes=True)``): ``prefill_static`` through ``torch.compile``
    (aot_eager here), one graph for every padded row count, the launched prefill's results."""
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    model.__dict__["_compiled_methods"] = {"prefill_static": torch.compile(model.prefill_static, backend=counter)}
    g = torch.Generator().manual_seed(3)
    try:
        graphs = VerifyGraphs(model, replay="eager")
        for length in (5, 20, 40, 70):  # buckets of 16, 32, 48 and 80 rows
            ids = torch.randint(0, model.config.vocab_size, (length,), generator=g)
            got = graphs.prefill(ids, 128, compiled=True)
            want = model.prefill(ids)
            torch.testing.assert_close(got.next_logits, want.next_logits)
            for buf, ref in zip(got.keys, want.keys):
                torch.testing.assert_close(buf[:, :length], ref)
    finally:
        model.__dict__.pop("_compiled_methods", None)
        torch._dynamo.reset()
    assert graphs.prefill_captures == 4 and counter.frame_count == 1
