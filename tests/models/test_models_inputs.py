"""Every bad input raises ValueError/TypeError whose message names the argument."""
from __future__ import annotations

import math

import pytest
import torch

from specfold_compile.models import build
from specfold_compile.models.cache import PrefixCache
from specfold_compile.models.checks import loop_built_rows
from specfold_compile.reference import folded_verify


@pytest.fixture(scope="module", params=["tiny-fast-dllm-v2", "tiny-nld"])
def setup(request):
    torch.set_num_threads(1)
    model = build(request.param, seed=0, max_position_embeddings=40)
    cache = model.prefill(torch.arange(1, 11))
    b = model.config.block_size
    tokens = torch.randint(0, model.config.vocab_size, (3, b), generator=torch.Generator().manual_seed(0))
    return model, cache, tokens, torch.tensor([-1, 0, 1])


def _both(model, tokens, parents, cache, exc, match, tau=0.1):
    """The dense forward and folded_verify reject the input the same way."""
    with pytest.raises(exc, match=match):
        model(tokens, parents, cache)
    with pytest.raises(exc, match=match):
        folded_verify(model, tokens, parents, cache, tau)


def test_good_input_runs(setup):
    model, cache, tokens, parents = setup
    with torch.no_grad():
        assert model(tokens, parents, cache).shape == (3, tokens.shape[1], model.config.vocab_size)


@pytest.mark.parametrize("bad", [[0, 0, 1], [5, 0, 1], [-1, 1, 1], [-1, 0, 2], [-1, 0, 3], [-1, -1, 0],
                                 [-1, 0, -2]])
def test_bad_parents_values(setup, bad):
    model, cache, tokens, _ = setup
    _both(model, tokens, torch.tensor(bad), cache, ValueError, r"^parents")


def test_bad_parents_shape_and_type(setup):
    model, cache, tokens, _ = setup
    _both(model, tokens, torch.tensor([-1, 0]), cache, ValueError, r"^parents")
    _both(model, tokens, torch.tensor([-1, 0, 1, 2]), cache, ValueError, r"^parents")
    _both(model, tokens, torch.tensor([-1.0, 0.0, 1.0]), cache, TypeError, r"^parents")
    _both(model, tokens, torch.tensor([[-1, 0, 1]]), cache, TypeError, r"^parents")
    _both(model, tokens, [-1, 0, 1], cache, TypeError, r"^parents")
    _both(model, tokens, torch.tensor([-1, 0, 1], dtype=torch.int32), cache, TypeError, r"^parents")
    _both(model, tokens[:0], torch.tensor([], dtype=torch.int64), cache, ValueError, r"^parents")


def test_bad_tokens(setup):
    model, cache, tokens, parents = setup
    _both(model, tokens[0], parents[:1], cache, TypeError, r"^tokens")
    _both(model, tokens[None], parents, cache, TypeError, r"^tokens")
    _both(model, tokens.float(), parents, cache, TypeError, r"^tokens")
    _both(model, tokens.int(), parents, cache, TypeError, r"^tokens")
    _both(model, tokens.tolist(), parents, cache, TypeError, r"^tokens")
    for bad_id in (-1, model.config.vocab_size, 10**6):
        bad = tokens.clone()
        bad[2, 3] = bad_id
        _both(model, bad, parents, cache, ValueError, r"^tokens")


@pytest.mark.parametrize("tau", [-0.1, -1e-9, math.nan, float("-inf"), torch.tensor(float("nan")),
                                 torch.tensor(-1.0)])
def test_bad_tau(setup, tau):
    model, cache, tokens, parents = setup
    with pytest.raises(ValueError, match=r"^tau"):
        folded_verify(model, tokens, parents, cache, tau)


def test_good_tau_forms(setup):
    model, cache, tokens, parents = setup
    a, _ = folded_verify(model, tokens, parents, cache, 0.1)
    b, _ = folded_verify(model, tokens, parents, cache, torch.tensor(0.1))
    assert torch.equal(a, b)
    folded_verify(model, tokens, parents, cache, float("inf"))  # folds wherever the parent row is nonzero


def test_bad_fold_masks_and_gate(setup):
    model, cache, tokens, parents = setup
    _, masks = folded_verify(model, tokens, parents, cache, 0.5)
    with pytest.raises(ValueError, match=r"^fold_masks"):
        folded_verify(model, tokens, parents, cache, 0.5, fold_masks=masks[:-1])
    bad = [m.clone() for m in masks]
    bad[0][0, 0] = True
    with pytest.raises(ValueError, match=r"^fold_masks"):
        folded_verify(model, tokens, parents, cache, 0.5, fold_masks=bad)
    with pytest.raises(ValueError, match=r"^fold_masks"):
        folded_verify(model, tokens, parents, cache, 0.5, fold_masks=[m[:, :-1] for m in masks])
    with pytest.raises(ValueError, match=r"^fold_masks"):
        folded_verify(model, tokens, parents, cache, 0.5, fold_masks=[m.float() for m in masks])
    with pytest.raises(ValueError, match=r"^gate"):
        folded_verify(model, tokens, parents, cache, 0.5, gate="token")


def test_bad_cache(setup):
    model, cache, tokens, parents = setup
    name = "tiny-nld" if model.config.family == "nld" else "tiny-fast-dllm-v2"
    other = build(name, seed=0, max_position_embeddings=40)
    foreign = other.prefill(torch.arange(1, 11))  # same shapes, same weights, another model
    _both(model, tokens, parents, foreign, ValueError, r"^cache")
    with pytest.raises(ValueError, match=r"^cache"):
        model.write_block(foreign, tokens[0])
    _both(model, tokens, parents, {"keys": cache.keys}, TypeError, r"^cache")
    with pytest.raises(TypeError, match=r"^cache"):
        model.write_block(None, tokens[0])
    truncated = PrefixCache(cache.keys[:-1], cache.values[:-1], cache.next_logits, cache.owner)
    _both(model, tokens, parents, truncated, ValueError, r"^cache")
    # a cache whose length plus the block exceeds max_position_embeddings (40)
    long_cache = model.prefill(torch.arange(1, 30))
    _both(model, tokens, parents, long_cache, ValueError, r"^cache.*max_position_embeddings")
    with pytest.raises(ValueError, match=r"^block_tokens.*max_position_embeddings"):
        model.write_block(long_cache, tokens[0])
    with pytest.raises(ValueError, match=r"^prompt_ids.*max_position_embeddings"):
        model.prefill(torch.arange(1, 42))


def test_bad_prefill_and_write_block(setup):
    model, cache, tokens, _ = setup
    for bad in (torch.tensor([[1, 2]]), torch.tensor([1.0, 2.0]), [1, 2], torch.tensor([1, 2], dtype=torch.int32)):
        with pytest.raises(TypeError, match=r"^prompt_ids"):
            model.prefill(bad)
        with pytest.raises(TypeError, match=r"^block_tokens"):
            model.write_block(cache, bad)
    for block_causal in (False, True):  # an empty prompt is the empty cache (Fast-dLLM v2's short prompts)
        empty = model.prefill(torch.tensor([], dtype=torch.int64), block_causal=block_causal)
        assert empty.length == 0 and empty.next_logits is None and len(empty.keys) == len(model.layers)
    for bad in (1, None, "yes"):
        with pytest.raises(TypeError, match=r"^block_causal"):
            model.prefill(torch.tensor([1, 2]), block_causal=bad)
        with pytest.raises(TypeError, match=r"^compiled"):
            model.prefill(torch.tensor([1, 2]), compiled=bad)
    for bad_id in (-1, model.config.vocab_size):
        with pytest.raises(ValueError, match=r"^prompt_ids"):
            model.prefill(torch.tensor([1, bad_id]))
        with pytest.raises(ValueError, match=r"^block_tokens"):
            model.write_block(cache, torch.tensor([1, bad_id]))
        with loop_built_rows():  # a decode loop's own block: its ids are not read back
            assert model.check_block(cache, torch.tensor([1, bad_id]))[1] == 2


def test_bad_logit_positions(setup):
    model, cache, tokens, parents = setup
    with torch.no_grad():
        assert model(tokens, parents, cache, logit_positions=torch.tensor([0, 5, 3])).shape == \
            (3, model.config.vocab_size)
        for bad, exc in [(torch.tensor([0.0]), TypeError), (torch.tensor([[0]]), TypeError), ([0, 1], TypeError),
                         (torch.tensor([0], dtype=torch.int32), TypeError),
                         (torch.tensor([tokens.numel()]), ValueError), (torch.tensor([-1]), ValueError),
                         (torch.zeros(1, dtype=torch.int64, device="meta"), ValueError)]:
            with pytest.raises(exc, match=r"^logit_positions"):
                model(tokens, parents, cache, logit_positions=bad)


def _bad_data_cases(model, tokens, parents):
    """(tokens, parents, logit_positions, name): data only a read of the values can reject."""
    vocab = model.config.vocab_size
    out_of_vocab, negative = tokens.clone(), tokens.clone()
    out_of_vocab[1, 2], negative[2, 0] = vocab, -1
    return [(out_of_vocab, parents, None, "tokens"), (negative, parents, None, "tokens"),
            (tokens, torch.tensor([-1, 0, 2]), None, "parents"), (tokens, torch.tensor([0, 0, 1]), None, "parents"),
            (tokens, parents, torch.tensor([0, tokens.numel()]), "logit_positions"),
            (tokens, parents, torch.tensor([-1, 3]), "logit_positions")]


@pytest.mark.parametrize("backend", ["specfold", "aot_eager"])
def test_compiled_forward_checks_its_data(setup, backend):
    """A compiled model launched from the host rejects out-of-range tokens, bad parents and out-of-range
    logit_positions with the eager ValueError (not an IndexError, a device assert or garbage), and the
    backend still receives the whole verification forward as one graph (every layer's attention)."""
    import torch._dynamo

    from specfold_compile.backend import specfold_backend

    model, cache, tokens, parents = setup
    torch._dynamo.reset()
    attention = []  # per graph the backend receives: attention ops in it (before the rewrite)

    def recording(gm, example_inputs):
        attention.append(sum(n.target is torch.ops.specfold.branch_attention.default for n in gm.graph.nodes))
        if backend == "specfold":
            return specfold_backend(gm, example_inputs, options={"tau": 0.5, "fold_launched": True})
        return torch._dynamo.backends.registry.lookup_backend(backend)(gm, example_inputs)

    compiled = torch.compile(model, backend=recording)
    with torch.no_grad():
        torch.testing.assert_close(compiled(tokens, parents, cache), model(tokens, parents, cache),
                                   atol=1e-4, rtol=1e-4)
        for bad_tokens, bad_parents, positions, name in _bad_data_cases(model, tokens, parents):
            with pytest.raises(ValueError, match=rf"^{name}"):
                compiled(bad_tokens, bad_parents, cache, positions)
    assert max(attention) == len(model.layers) and sum(a > 0 for a in attention) <= 2  # logit_positions: 2nd
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["specfold", "eager"])
def test_compiled_by_name_checks_its_data(setup, backend):
    """The same through torch.compile's registered backends: backend="specfold" with its defaults, and
    Dynamo's eager backend (the checks run outside the traced graph whatever the backend)."""
    import torch._dynamo

    model, cache, tokens, parents = setup
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(compiled(tokens, parents, cache), model(tokens, parents, cache),
                                   atol=1e-4, rtol=1e-4)
        for bad_tokens, bad_parents, positions, name in _bad_data_cases(model, tokens, parents):
            with pytest.raises(ValueError, match=rf"^{name}"):
                compiled(bad_tokens, bad_parents, cache, positions)
    torch._dynamo.reset()
