"""Per-layer cuBLAS heads: ``dense_fraction`` as a profile over the depth (``Tuning.dense_fraction``), the
layer each entry reaches (``fold_ops.layer_dense_fraction``, the lowered graph, the cost model), and the
profile measured from recorded fold masks (``fold_masks.dense_fractions``)."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from specfold_compile.backend import SpecFoldSettings, compile_graph, dispatch
from specfold_compile.backend import Tuning  # the public path the guide names
from specfold_compile.ops import fold_ops
from specfold_compile.ops.fold_masks import dense_fractions, recorded_fold_masks
from specfold_compile.testing import ModelSpec, capture_graph, make_cache, make_tree


def test_a_sequence_is_kept_as_a_tuple_and_bad_ones_are_named():
    assert Tuning(dense_fraction=[0.1, 0.5]).dense_fraction == (0.1, 0.5)
    assert SpecFoldSettings(dense_fraction=(0.2,)).dense_fraction == (0.2,)
    assert Tuning(dense_fraction=1).dense_fraction == 1.0
    for bad in ([], [0.2, 1.5], "0.3", [True], -0.1):
        with pytest.raises(ValueError, match=r"^tuning.dense_fraction: expected a number in \[0, 1\] or a "):
            Tuning(dense_fraction=bad)
    with pytest.raises(ValueError, match=r"^options\['dense_fraction'\]: expected"):
        SpecFoldSettings(dense_fraction=[2])


@given(entries=st.lists(st.floats(0, 1), min_size=1, max_size=9), layers=st.integers(1, 40))
def test_layers_take_entries_spread_over_the_depth(entries, layers):
    profile = tuple(entries)
    taken = [fold_ops.layer_dense_fraction(profile, layer, layers) for layer in range(layers)]
    want = [profile[layer * len(profile) // layers] for layer in range(layers)]
    assert taken == want
    assert taken[0] == profile[0]
    if layers >= len(profile):  # every entry reaches some layer, in order
        assert sorted(set(range(len(profile)))) == sorted({layer * len(profile) // layers for layer in range(layers)})
    assert fold_ops.layer_dense_fraction(profile, layers, layers) == profile[-1]  # the LM head's region
    assert fold_ops.layer_dense_fraction(0.3, 5, layers) == 0.3


def test_each_layers_packed_linears_get_their_own_head():
    model = ModelSpec(family="fast-dllm-v2", layers=3, block=8, seed=1).build()
    cache = make_cache(model)
    tokens, parents = make_tree(model, 4, "realistic", 3)
    gm, _ = capture_graph(model, tokens, parents, cache)
    rewritten = compile_graph(gm, SpecFoldSettings(tau=0.3, kernels="torch", dense_fraction=(0.1, 0.5, 0.9)))
    heads = [n.kwargs["dense_fraction"] for n in rewritten.graph.nodes if n.target is fold_ops.PACKED_LINEAR]
    per_layer = len(heads) // 3
    assert per_layer >= 2 and heads == [0.1] * per_layer + [0.5] * per_layer + [0.9] * per_layer


def test_cost_model_averages_the_layers_heads():
    shapes = [(8960, 1536)] * 3 * 28 + [(1536, 1536)] * 2 * 28  # about the 1.5B shape's MLP and q/o
    folds = lambda s, n: dispatch.cost_model_folds(n, 32, shapes, 28, s)  # noqa: E731
    for n in (2, 9, 17, 33, 65):
        assert folds(SpecFoldSettings(dense_fraction=(0.45,) * 7), n) == folds(SpecFoldSettings(), n)
    first = lambda s: next(n for n in range(2, 129) if folds(s, n))  # noqa: E731
    # smaller heads in half the layers: folding pays from fewer branches on; cuBLAS on every row: never
    assert first(SpecFoldSettings(dense_fraction=(0.1, 0.45))) <= first(SpecFoldSettings())
    assert not any(folds(SpecFoldSettings(dense_fraction=(1.0, 1.0)), n) for n in (2, 17, 128))


def _masks(gates: int, calls: int, seed: int) -> list[tuple[int, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    recorded = []
    for _ in range(calls):
        n = int(torch.randint(2, 6, (1,), generator=g))
        p = float(torch.rand(1, generator=g))
        for gate in range(gates):
            recorded.append((gate, torch.rand(n, 8, generator=g) < p))
    return recorded


@settings(max_examples=30, deadline=None)
@given(gates=st.integers(1, 6), calls=st.integers(1, 12), seed=st.integers(0, 2**16),
       quantile=st.sampled_from([0.5, 0.9, 1.0, 0.01]))
def test_fractions_are_each_gates_computed_share_at_the_quantile(gates, calls, seed, quantile):
    recorded = _masks(gates, calls, seed)
    got = dense_fractions(recorded, quantile=quantile)
    assert len(got) == gates
    for gate in range(gates):
        shares = sorted(int((~m).sum()) / m.numel() for g, m in recorded if g == gate)
        rank = max(math.ceil(quantile * len(shares)), 1)  # the smallest share with >= quantile of calls at or below
        assert got[gate] == pytest.approx(shares[rank - 1])
        assert sum(s <= got[gate] + 1e-12 for s in shares) >= quantile * len(shares)
    if quantile == 1.0:
        assert got == tuple(max(int((~m).sum()) / m.numel() for g, m in recorded if g == gate) for gate in range(gates))
    if gates % 2 == 0:
        pairs = dense_fractions(recorded, quantile=quantile, gates_per_layer=2)
        assert pairs == tuple(max(got[i], got[i + 1]) for i in range(0, gates, 2))


def test_fractions_refuse_what_they_cannot_use():
    recorded = _masks(2, 3, 0)
    for kwargs, match in (({"quantile": 0}, "quantile"), ({"quantile": 1.5}, "quantile"),
                          ({"gates_per_layer": 0}, "gates_per_layer"), ({"gates_per_layer": 3}, "multiple")):
        with pytest.raises(ValueError, match=match):
            dense_fractions(recorded, **kwargs)
    with pytest.raises(ValueError, match="no fold masks"):
        dense_fractions([])
    with pytest.raises(ValueError, match="gates 0..G-1"):
        dense_fractions([(0, torch.zeros(2, 8, dtype=torch.bool)), (2, torch.zeros(2, 8, dtype=torch.bool))])
    with pytest.raises(ValueError, match="bool fold mask"):
        dense_fractions([(0, torch.zeros(2, 8))])


def test_fractions_from_a_recorded_decode_fit_its_calls():
    """Recorded from a compiled call, a profile at quantile 1 holds every gate's computed rows of it."""
    from specfold_compile.backend import SpecFoldBackend, collect_stats

    model = ModelSpec(family="fast-dllm-v2", layers=2, block=8, seed=2).build()
    cache = make_cache(model, seed=4)
    compiled = torch.compile(model, backend=SpecFoldBackend(tau=0.3, kernels="torch", fold_min_branches=1))
    tokens, parents = make_tree(model, 6, "realistic", 5)
    with recorded_fold_masks() as seen, collect_stats() as s:
        compiled(tokens, parents, cache)
    assert s.calls == 1
    profile = dense_fractions(seen, quantile=1.0)
    assert len(profile) == 2
    for (gate, mask), fraction in zip(seen, profile):
        assert int((~mask).sum()) == round(fraction * mask.numel())
        assert 1 / 6 <= fraction <= 1  # the main row is always computed
