"""P5 on the real tiny models (random weights, float32, CPU)."""

import pytest
import torch

from specfold_compile.decoding import calibrate, generate, load_draft_graph, record_traces

PROMPTS = [[5, 6, 7, 8, 9], [20, 3, 44], [2, 90, 17, 33, 4, 61, 12]]


def test_p5_real_tiny(model):
    tot_v = tot_s = 0
    for p in PROMPTS:
        p = torch.tensor(p, dtype=torch.long)
        for th in (0.9, 0.5):
            v = generate(model, p, max_new_tokens=48, threshold=th)
            s = generate(model, p, mode="spiffy", max_new_tokens=48, threshold=th, draft_budget=8)
            assert s.tokens == v.tokens
            # every position's logits (all_logits) decode the same tokens as the masked positions' only
            full = generate(model, p, mode="spiffy", max_new_tokens=48, threshold=th, draft_budget=8,
                            all_logits=True)
            assert full.tokens == s.tokens and full.nfe == s.nfe
            assert [st.accepted for st in full.steps] == [st.accepted for st in s.steps]
            assert s.nfe <= v.nfe
            tot_v += v.nfe
            tot_s += s.nfe
    assert tot_s < tot_v


def test_calibrated_graph_real_tiny(model):
    prompts = [torch.tensor(p, dtype=torch.long) for p in PROMPTS]
    tr = record_traces(model, prompts, max_new_tokens=48)
    B = model.config.block_size
    g = calibrate(tr, size=8, max_level=3)
    assert len(load_draft_graph(g, B)) == 8
    for p in prompts[:2]:
        v = generate(model, p, max_new_tokens=48)
        s = generate(model, p, mode="spiffy", draft_graph=g, draft_budget=5, max_new_tokens=48)
        assert s.tokens == v.tokens and s.nfe <= v.nfe
        assert max(st.branches for st in s.steps) <= 6


def test_compiled_writes_match_eager(model):
    """generate(compile_writes=True) runs prefill / write_block through torch.compile: the same caches
    (to float32 rounding) and the same tokens as eager, with one graph for prompts of any length and one
    for blocks at any prefix length (lengths are marked dynamic, no recompile per size)."""
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    model.__dict__["_compiled_methods"] = {"append_block": torch.compile(model.append_block, backend=counter)}
    try:
        with torch.inference_mode():
            for p in PROMPTS:
                p = torch.tensor(p, dtype=torch.long)
                eager, comp = model.prefill(p), model.prefill(p, compiled=True)
                block = torch.randint(0, model.config.vocab_size, (model.config.block_size,),
                                      generator=torch.Generator().manual_seed(len(p)))
                for _ in range(2):
                    eager, comp = model.write_block(eager, block), model.write_block(comp, block, compiled=True)
                for a, b in zip(eager.keys + eager.values + [eager.next_logits],
                                comp.keys + comp.values + [comp.next_logits]):
                    assert a.shape == b.shape
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert counter.frame_count == 2, counter.frame_count  # prompts, blocks
        for p in PROMPTS[:2]:
            p = torch.tensor(p, dtype=torch.long)
            v = generate(model, p, mode="spiffy", max_new_tokens=48, draft_budget=8)
            c = generate(model, p, mode="spiffy", max_new_tokens=48, draft_budget=8, compile_writes=True)
            assert c.tokens == v.tokens and c.nfe == v.nfe
    finally:
        model.__dict__.pop("_compiled_methods", None)
        torch._dynamo.reset()


def test_compile_writes_rejects_non_bool(model):
    p = torch.tensor(PROMPTS[0], dtype=torch.long)
    with pytest.raises(TypeError, match="compile_writes"):
        generate(model, p, compile_writes=1)
    with pytest.raises(TypeError, match="compiled"):
        model.write_block(model.prefill(p), p, compiled="yes")
