"""``Engine(compile_layers=...)`` (``serving.compiled``): the passes run each decoder layer's position-wise
pieces through ``torch.compile``; the model is left as it was, the pieces compute the eager pieces on
random rows, as do a folded forward's pieces compiled whole, one compiled graph a piece serves every layer
and row count, and the engine decodes the
plain engine's tokens and fold masks, launched and replayed from (eager) graphs, with Inductor too."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch._dynamo import list_backends, register_backend

from specfold_compile.serving import BatchGraphs, Engine, RequestParams
from specfold_compile.reference import FOLDED_PIECES, PACKED_ATTENTION_PIECES, fold_test
from specfold_compile.serving.compiled import (POSITION_WISE, base_model, check_compile_layers, compiled_model,
                                               folded_pieces, gate_test)
from specfold_compile.testing import TINY_FAMILIES as FAMILIES, assert_close, tiny_model

GRAPHS: list = []  # what the counting backend compiled
CALLS = [0]  # and how often its graphs ran


def _counting(gm, example_inputs):
    """A torch.compile backend that runs Dynamo's graph as it is, counting graphs and calls."""
    GRAPHS.append(gm)

    def run(*args):
        CALLS[0] += 1
        return gm.forward(*args)
    return run


if "counting" not in list_backends(exclude_tags=()):
    register_backend(_counting, name="counting")


def test_the_view_leaves_the_model_alone():
    model = tiny_model(FAMILIES[0])
    view = compiled_model(model, "counting")
    assert compiled_model(model, None) is model and base_model(view) is model and base_model(model) is model
    assert view.embed_tokens is model.embed_tokens and view.config is model.config and view.head == model.head
    assert len(view.layers) == len(model.layers)
    for mine, theirs in zip(view.layers, model.layers):
        assert mine.scale == theirs.scale and mine.self_attn is theirs.self_attn
        assert not any(name in theirs.__dict__ for name in POSITION_WISE)  # the model's methods untouched
        assert theirs.qkv.__func__ is type(theirs).qkv


@pytest.mark.parametrize("family", FAMILIES)
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
          max_examples=4)
@given(rows=st.integers(2, 9), start=st.integers(0, 40), seed=st.integers(0, 2**16))
def test_compiled_pieces_compute_the_eager_pieces(family, rows, start, seed):
    model = tiny_model(family)
    view = compiled_model(model, "counting")
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    block = int(cfg.block_size)
    h = torch.randn(rows, block, cfg.hidden_size, generator=gen)
    pos = model.position_tables(torch.arange(block) + start)
    graphs = len(GRAPHS)
    for mine, theirs in zip(view.layers, model.layers):
        for a, b in zip(mine.qkv(h, pos), theirs.qkv(h, pos)):
            assert_close(a, b)
        o = torch.randn(rows, block, theirs.num_heads, theirs.head_dim, generator=gen)
        assert_close(mine.attn_out(o), theirs.attn_out(o))
        assert_close(mine.mlp_out(h), theirs.mlp_out(h))
    # dynamic shapes: every layer and row count shares one graph a piece (a compile a layer would be
    # twice as many: the tiny models have two layers)
    assert len(GRAPHS) - graphs <= len(POSITION_WISE)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("packed_attention", [False, True])
def test_compiled_folded_pieces_compute_the_reference_pieces(family, packed_attention):
    """A folded forward's pieces (``reference.FOLDED_PIECES``: gathers of the packed rows, RoPE tables and
    origins included; ``PACKED_ATTENTION_PIECES``, q, k, v left packed) compiled whole compute the eager
    pieces, one graph a piece for every layer and every packed count."""
    model = tiny_model(family)
    view = compiled_model(model, "counting")
    reference = PACKED_ATTENTION_PIECES if packed_attention else FOLDED_PIECES
    layers, pieces = folded_pieces(view, packed_attention)
    assert layers is model.layers and folded_pieces(model, packed_attention) == (model.layers, reference)
    cfg, gen = model.config, torch.Generator().manual_seed(0)
    block, graphs, calls = int(cfg.block_size), len(GRAPHS), CALLS[0]
    for rows, packed in ((5, 40), (7, 70)):  # (flat sizes unlike the model's: no duck-shaped specialization)
        h = torch.randn(rows, block, cfg.hidden_size, generator=gen)
        tables = model.position_tables(torch.arange(rows * block) + 7)  # any table a flat position
        computed = torch.sort(torch.randperm(rows * block, generator=gen)[:packed]).values
        slot = torch.randint(0, packed, (rows, block), generator=gen)
        for layer in layers:
            o = torch.randn(rows, block, layer.num_heads, layer.head_dim, generator=gen)
            args = ((layer, h, computed, slot, tables), (layer, h, o), (layer, h, computed, slot))
            for mine, theirs, a in zip(pieces, reference, args):
                got, want = mine(*a), theirs(*a)
                for x, y in zip(*((got, want) if isinstance(got, tuple) else ((got,), (want,)))):
                    assert_close(x, y)
    assert len(GRAPHS) - graphs <= len(FOLDED_PIECES)
    assert CALLS[0] - calls == 2 * len(layers) * len(FOLDED_PIECES)  # every piece ran compiled


def test_compiled_gate_test_decides_as_the_eager_one():
    """The gates' fold test compiled (``compiled.gate_test``) folds what the eager test folds, on residual
    streams whose ratios lie far from tau (near it, rounding may decide either way), across row counts
    with one graph."""
    model = tiny_model(FAMILIES[0])
    test, graphs, calls = gate_test(compiled_model(model, "counting")), len(GRAPHS), CALLS[0]
    assert gate_test(model) is fold_test and test is not fold_test
    gen, tau = torch.Generator().manual_seed(1), torch.tensor(0.3)
    for rows in (5, 9):
        parent = torch.tensor([0] + [int(torch.randint(0, n, (), generator=gen)) for n in range(1, rows)])
        h = torch.randn(rows, 16, 24, generator=gen)
        direction = torch.randn(h.shape, generator=gen)
        direction = direction / direction.norm(dim=-1, keepdim=True)
        ratio = torch.where(torch.rand(rows, 16, 1, generator=gen) < 0.5, 0.1, 0.6)  # 1/3 or 2x tau
        for n in range(1, rows):
            h[n] = h[parent[n]] + ratio[n] * h[parent[n]].norm(dim=-1, keepdim=True) * direction[n]
        want = fold_test(h, parent, tau)
        assert torch.equal(test(h, parent, tau), want) and 0 < int(want.sum()) < rows * 16
    assert len(GRAPHS) - graphs <= 1 and CALLS[0] - calls == 2  # compiled, one graph


WORKLOAD = [(torch.randint(0, 90, (n,), generator=torch.Generator().manual_seed(n)),
             RequestParams(max_new_tokens=m, stop_at_eos=False, threshold=t, draft_budget=3))
            for n, m, t in ((5, 3, 0.2), (19, 2, 0.9), (12, 5, 0.15))]


def _decode(engine):
    ids = [engine.add_request(p, r) for p, r in WORKLOAD]
    masks = {i: [] for i in ids}
    while engine.has_work:
        engine.step()
        for i in ids:  # copies: a replayed graph's next run overwrites its outputs
            masks[i] += [m.clone() for m in engine.output(i).fold_masks[len(masks[i]):]]
    return [engine.output(i).result.tokens for i in ids], [masks[i] for i in ids]


def _same(got, want):
    assert got[0] == want[0]
    for g, w in zip(got[1], want[1]):
        assert len(g) == len(w) and all(torch.equal(a, b) for a, b in zip(g, w))


@pytest.mark.parametrize("family, mode, tau, graphs", [
    (FAMILIES[0], "spiffy", None, False),
    (FAMILIES[1], "specfold", 0.3, False),
    (FAMILIES[0], "specfold", 0.3, "eager"),
    (FAMILIES[1], "spiffy", None, "eager"),
])
def test_a_compiled_engine_decodes_the_plain_engines_tokens(family, mode, tau, graphs):
    model = tiny_model(family)
    kwargs = dict(mode=mode, tau=tau, attention="ragged")
    want = _decode(Engine(model, 2, 64, **kwargs))
    calls = CALLS[0]
    engine = Engine(model, 2, 64, cuda_graphs=graphs, compile_layers="counting", **kwargs)
    got = _decode(engine)
    _same(got, want)
    # every verification forward ran every layer's pieces compiled (prefills: the model's own forward)
    assert CALLS[0] - calls >= engine.stats.verify_calls * len(model.layers) * len(POSITION_WISE)
    assert engine.model.layers is not model.layers and base_model(engine.model) is model


def test_an_inductor_engine_decodes_the_plain_engines_tokens():
    model = tiny_model(FAMILIES[0])
    kwargs = dict(mode="specfold", tau=0.3, attention="ragged")
    want = _decode(Engine(model, 2, 64, **kwargs))
    got = _decode(Engine(model, 2, 64, cuda_graphs="eager", compile_layers=True, **kwargs))
    _same(got, want)


def test_bad_compile_layers_and_a_mismatched_shared_graph_are_refused():
    assert check_compile_layers(False) is None and check_compile_layers(True) == "inductor"
    model = tiny_model(FAMILIES[0])
    for bad in (1, "nope", 0.5):
        with pytest.raises(ValueError, match="^compile_layers: expected False, True"):
            Engine(model, 2, 64, compile_layers=bad)
        with pytest.raises(ValueError, match="^compile_layers: expected"):
            BatchGraphs(model, 2, 64, "eager", compile_layers=bad)
    graphs = BatchGraphs(model, 2, 64, "eager", compile_layers="counting")
    with pytest.raises(ValueError, match="^compile_layers: the shared BatchGraphs runs its layers compiled by"):
        Engine(model, 2, 64, cuda_graphs=graphs)
    plain = BatchGraphs(model, 2, 64, "eager")
    with pytest.raises(ValueError, match="^compile_layers: the shared BatchGraphs runs its layers eagerly"):
        Engine(model, 2, 64, cuda_graphs=plain, compile_layers="counting")
    assert Engine(model, 2, 64, cuda_graphs=graphs, compile_layers="counting").model is graphs.model


def test_generate_on_a_list_takes_the_engines_graphs_and_compiled_layers():
    import specfold_compile

    model = tiny_model(FAMILIES[1])
    prompts = [p for p, _ in WORKLOAD]
    batched = specfold_compile.generate(model, prompts, mode="spiffy", max_new_tokens=4, stop_at_eos=False,
                                        cuda_graphs="eager", compile_layers="counting")
    alone = [specfold_compile.generate(model, p, mode="spiffy", max_new_tokens=4, stop_at_eos=False)
             for p in prompts]
    assert [r.tokens for r in batched] == [a.tokens for a in alone]
