"""The device loop's logits at the main state's masked positions and position 0, padded to a power of two
(``device_loop.logit_width`` / ``logit_positions``): the widths, the positions, and decodes that equal
every position's logits (``all_logits=True``) and the Python loop."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoding_fake_model import FakeModel
from specfold_compile.decoding import generate
from specfold_compile.decoding.device_loop import MIN_LOGIT_WIDTH, DeviceDecoder, logit_positions, logit_width
from test_device_step_loop import assert_same_decode, calls

HSET = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@given(block=st.sampled_from([1, 2, 4, 8, 16, 32, 64]), data=st.data())
def test_width_holds_the_masked_positions_and_position_0(block, data):
    masked = data.draw(st.integers(0, block))
    width = logit_width(masked, block)
    assert width == block or (width & (width - 1) == 0 and width >= MIN_LOGIT_WIDTH)
    assert min(masked + 1, block) <= width <= block
    assert width == block or width == MIN_LOGIT_WIDTH or width // 2 < masked + 1  # the smallest that holds them


@pytest.mark.parametrize("masked", [-1, 9])
def test_width_checks_its_count(masked):
    with pytest.raises(ValueError, match="masked: expected 0 <= masked <= block = 8"):
        logit_width(masked, 8)


@settings(max_examples=50, **HSET)
@given(block=st.sampled_from([4, 8, 16]), n=st.integers(1, 5), data=st.data())
def test_positions_put_the_wanted_ones_first(block, n, data):
    mask_id = 99
    main = torch.tensor(data.draw(st.lists(st.sampled_from([1, 2, mask_id]), min_size=block, max_size=block)))
    rows = main.repeat(n, 1)
    wanted = sorted({0} | {p for p in range(block) if main[p] == mask_id})
    width = logit_width(int((main == mask_id).sum()), block)
    sel, flat = logit_positions(rows, width, mask_id)
    assert sel[:len(wanted)].tolist() == wanted
    assert sorted(sel.tolist()) == sorted(set(sel.tolist())) and len(sel) == width  # distinct positions
    assert flat.tolist() == [r * block + p for r in range(n) for p in sel.tolist()]


def _widths(monkeypatch):
    seen = []
    run = DeviceDecoder._run

    def recorded(self, n, width, cache):
        seen.append((n, width))
        return run(self, n, width, cache)
    monkeypatch.setattr(DeviceDecoder, "_run", recorded)
    return seen


@settings(max_examples=15, **HSET)
@given(seed=st.integers(0, 10**6), cfg=st.sampled_from([(8, 4), (16, 8), (16, None)]), budget=st.integers(0, 6),
       p=st.lists(st.integers(0, 13), min_size=1, max_size=20), threshold=st.sampled_from([0.3, 0.9]))
def test_narrow_logits_decode_as_every_positions(seed, cfg, budget, p, threshold):
    """The device loop with its logit widths decodes as with every position's logits, and as the Python
    loop (which asks for each row's masked positions): tokens, forwards and calls."""
    block, sub = cfg
    model = FakeModel(block_size=block, sub_block_size=sub, vocab_size=16, seed=seed)
    prompt = torch.tensor(p, dtype=torch.long)
    for mode in ("vanilla", "spiffy"):
        kwargs = dict(mode=mode, max_new_tokens=2 * block, threshold=threshold, draft_budget=budget,
                      confidence_dtype="float32")
        _, narrow = assert_same_decode(model, prompt, **kwargs)
        every = generate(model, prompt, loop="device", all_logits=True, **kwargs)
        assert narrow.tokens == every.tokens and narrow.nfe == every.nfe and calls(narrow) == calls(every)


def test_widths_narrow_as_a_block_fills(monkeypatch):
    """A block's later steps ask for fewer positions; ``all_logits=True`` asks for every one."""
    seen = _widths(monkeypatch)
    model = FakeModel(block_size=16, sub_block_size=4, vocab_size=16, seed=3)
    prompt = torch.tensor([2, 3, 1])
    generate(model, prompt, loop="device", mode="spiffy", max_new_tokens=32, threshold=0.3, draft_budget=4)
    assert {w for _, w in seen} > {16} and min(w for _, w in seen) < 16
    seen.clear()
    generate(model, prompt, loop="device", mode="spiffy", max_new_tokens=32, threshold=0.3, draft_budget=4,
             all_logits=True)
    assert seen and {w for _, w in seen} == {16}


class _NoPositions(torch.nn.Module):
    """A model whose forward takes no ``logit_positions``."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.config = model, model.config

    def forward(self, tokens, parents, cache):
        return self.inner(tokens, parents, cache)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)


def test_a_forward_without_logit_positions_is_named():
    model = _NoPositions(FakeModel(block_size=8, sub_block_size=4, seed=0))
    prompt = torch.tensor([2, 3])
    with pytest.raises(TypeError, match=r"takes no logit_positions .*all_logits=True"):
        generate(model, prompt, loop="device", max_new_tokens=8)
    every = generate(model, prompt, loop="device", max_new_tokens=8, all_logits=True)
    assert every.tokens == generate(model, prompt, max_new_tokens=8, all_logits=True).tokens


class _IgnoresPositions(_NoPositions):
    def forward(self, tokens, parents, cache, logit_positions=None):
        return self.inner(tokens, parents, cache)


def test_a_forward_that_ignores_logit_positions_is_named():
    """Its logits [n, B, V] come back where [M, V] was asked for: the device loop stops with the Python
    loop's one-line error, before any bookkeeping reads them."""
    model = _IgnoresPositions(FakeModel(block_size=8, sub_block_size=4, seed=0))
    prompt = torch.tensor([2, 3])
    for loop in ("device", "host"):
        with pytest.raises(ValueError, match=r"^model: expected logits \[M=\d+, V\] .*all_logits=True"):
            generate(model, prompt, loop=loop, max_new_tokens=8)


def test_every_width_shares_one_compiled_graph(monkeypatch):
    """A compiled forward traces each row count once whatever the width (the full width passes positions
    too): the narrow logits compile no more graphs than every position's."""
    from specfold_compile.decoding.device_loop import decode_on_device
    from specfold_compile.decoding.graph import default_draft_graph, load_draft_graph
    from specfold_compile.models import build

    model = build("tiny-fast-dllm-v2", seed=0)
    B = model.config.block_size
    graph = load_draft_graph(default_draft_graph(B), B)
    graphs, seen = {}, _widths(monkeypatch)
    for every in (True, False):
        torch._dynamo.reset()
        compiled = []

        def backend(gm, inputs):
            compiled.append(gm)
            return gm.forward
        forward = torch.compile(model, backend=backend)
        try:
            for prompt in ([7, 19, 3, 88, 41], list(range(2, 40))):
                decode_on_device(model, torch.tensor(prompt), "spiffy", 2 * B, 0.3, 6, graph, False, forward=forward,
                                 compile_step=False, all_logits=every)
        finally:
            torch._dynamo.reset()
        graphs[every] = len(compiled)
    widths = {w for _, w in seen}
    assert len(widths) > 2  # several widths ran, the full one among them
    assert graphs[False] == graphs[True]
