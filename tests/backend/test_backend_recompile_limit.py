"""Past Dynamo's recompile limit a compiled model runs eagerly; for a function the specfold backend compiled
that is a warning (strict: an error), and the backend raises the limit for the graphs it needs itself."""

import warnings

import pytest
import torch
import torch._dynamo

from specfold_compile.testing import ModelSpec, make_cache, make_tree
from specfold_compile.backend import RecompileLimitError, SpecFoldBackend, collect_stats, recompile_limit


@pytest.fixture(scope="module")
def tiny():
    model = ModelSpec(family="nld", layers=1, block=8, seed=2).build()
    cache = make_cache(model)
    tokens, parents = make_tree(model, 3, "realistic", 1)
    return model, tokens, parents, cache


def _tau_loop(model, tokens, parents, cache, taus, **options):
    """One compile per tau (a new backend object is a new Dynamo cache entry of the same forward); the
    number of calls that reached a folded graph, per tau."""
    reached = []
    for tau in taus:
        with collect_stats() as s:
            torch.compile(model, backend=SpecFoldBackend(tau=tau, kernels="torch", **options))(tokens, parents, cache)
        reached.append(s.calls)
    return reached


def test_tau_loop_past_the_limit_warns(tiny, monkeypatch):
    monkeypatch.setattr(recompile_limit, "MIN_RECOMPILE_LIMIT", 0)  # keep the user's (tiny) limit
    with torch._dynamo.config.patch(recompile_limit=2), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        reached = _tau_loop(*tiny, taus=[0.1, 0.2, 0.3, 0.4])
    assert reached == [1, 1, 0, 0]  # the third and later compiles ran eager
    found = [str(w.message) for w in record if "recompile_limit" in str(w.message)]
    assert len(found) == 1, found
    assert found[0].startswith("specfold: Dynamo hit config.recompile_limit (2) for 'forward' (")
    assert "transformer.py" in found[0] and "torch._dynamo.reset()" in found[0]


def test_strict_raises_past_the_limit(tiny, monkeypatch):
    monkeypatch.setattr(recompile_limit, "MIN_RECOMPILE_LIMIT", 0)
    with torch._dynamo.config.patch(recompile_limit=1), pytest.raises(RecompileLimitError, match="eagerly"):
        _tau_loop(*tiny, taus=[0.1, 0.2], strict=True)


def test_a_strict_compile_reset_away_leaves_later_ones_warning(tiny, monkeypatch):
    """strict describes the graphs Dynamo holds: after torch._dynamo.reset() a non-strict sweep warns."""
    monkeypatch.setattr(recompile_limit, "MIN_RECOMPILE_LIMIT", 0)
    with torch._dynamo.config.patch(recompile_limit=2):
        _tau_loop(*tiny, taus=[0.5], strict=True)
        torch._dynamo.reset()
        with pytest.warns(UserWarning, match="recompile_limit"):
            assert _tau_loop(*tiny, taus=[0.1, 0.2, 0.3]) == [1, 1, 0]


def test_the_backend_raises_the_limit_for_verification_graphs(tiny):
    model, tokens, parents, cache = tiny
    with torch._dynamo.config.patch(recompile_limit=4):
        torch.compile(model._sequence, backend=SpecFoldBackend())(  # no marker: not a verification graph
            torch.tensor([[1, 2, 3]]), torch.arange(3), torch.ones(1, 3, 3, dtype=torch.bool).tril(), None)
        assert torch._dynamo.config.recompile_limit == 4
        assert _tau_loop(model, tokens, parents, cache, taus=[0.1]) == [1]
        assert torch._dynamo.config.recompile_limit == recompile_limit.MIN_RECOMPILE_LIMIT
    with torch._dynamo.config.patch(recompile_limit=100):  # a higher limit is kept
        _tau_loop(model, tokens, parents, cache, taus=[0.2])
        assert torch._dynamo.config.recompile_limit == 100
