"""``SpecFoldBackend(**options)``: validated at construction, usable as ``torch.compile(..., backend=obj)``
beside ``backend="specfold"``, with a record per compiled graph; a huge tau is the float32 it rounds to."""

import math

import pytest
import torch

import specfold_compile
from specfold_compile.testing import ModelSpec, assert_close, make_cache, make_tree
from specfold_compile.backend import GraphRecord, SpecFoldBackend, SpecFoldSettings, collect_stats


@pytest.fixture(scope="module")
def tiny():
    model = ModelSpec(family="fast-dllm-v2", layers=2, block=8, seed=1).build()
    cache = make_cache(model)
    tokens, parents = make_tree(model, 4, "realistic", 3)
    return model, tokens, parents, cache


def test_exported_from_the_package():
    assert specfold_compile.SpecFoldBackend is SpecFoldBackend


@pytest.mark.parametrize("options, pattern", [
    ({"tau": float("nan")}, r"^options\['tau'\]: expected a number >= 0, got nan$"),
    ({"tau": -1e-3}, r"^options\['tau'\]: expected a number >= 0"),
    ({"tau": "0.1"}, None),  # a numeric string is a number
    ({"tua": 0.1}, r"^options: unknown option\(s\) \['tua'\]; valid options: \["),
    ({"kernels": "cuda"}, r"^options\['kernels'\]: expected one of"),
    ({"dump_dir": 3}, r"^options\['dump_dir'\]: expected None or a path"),
])
def test_options_validated_at_construction(options, pattern):
    if pattern is None:
        assert SpecFoldBackend(**options).settings.tau == 0.1
        return
    with pytest.raises((ValueError, TypeError), match=pattern) as info:
        SpecFoldBackend(**options)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("tau", [1e39, 10 ** 400, math.inf])
def test_tau_past_float32_is_inf(tau):
    settings = SpecFoldSettings(tau=tau)
    assert settings.gate_tau == math.inf


def test_tau_1e39_folds_every_row_it_can(tiny):
    """tau = 1e39 rounds to inf in the float32 gate: every draft row with a finite, nonzero parent folds."""
    model, tokens, parents, cache = tiny
    backend = SpecFoldBackend(tau=1e39, kernels="torch", strict=True)
    with collect_stats() as s:
        out = torch.compile(model, backend=backend)(tokens, parents, cache)
    assert all(bool(m[1:].all()) and not m[0].any() for m in s.fold_masks)
    assert torch.isfinite(out).all()
    assert_close(out[:1], model(tokens[:1], parents[:1], cache), what="P2")


def test_backend_object_matches_the_registered_name_and_records_graphs(tiny):
    model, tokens, parents, cache = tiny
    backend = SpecFoldBackend(tau=0.3, kernels="torch")
    compiled = torch.compile(model, backend=backend)
    with collect_stats() as s:
        out = compiled(tokens, parents, cache)
        compiled(tokens[:1], parents[:1], cache)  # N = 1: a second graph, left unchanged
    assert s.calls == 1 and s.folded_rows > 0
    torch._dynamo.reset()
    by_name = torch.compile(model, backend="specfold", options={"tau": 0.3, "kernels": "torch"})(tokens, parents, cache)
    assert torch.equal(out, by_name)
    assert len(backend.graphs) == 2 and all(isinstance(g, GraphRecord) for g in backend.graphs)
    folded, single = backend.graphs
    assert folded.folded and not folded.blockers and folded.skip_reason is None
    assert "forward" in folded.function and "decoder layers found: 2" in folded.report
    assert "fold every multi-branch call" in folded.fold_plan.description
    assert not single.folded and "N = 1" in single.skip_reason and single.fold_plan is None
    assert folded.compile_id != single.compile_id
    assert "tau=0.3" in repr(backend)


def test_blockers_are_recorded(tiny):
    from test_backend_options import TinyVerifier, _verifier_inputs

    backend = SpecFoldBackend(tau=0.5)
    with pytest.warns(UserWarning, match="specfold: running this graph unchanged"):
        torch.compile(TinyVerifier("cumsum"), backend=backend)(*_verifier_inputs())
    (record,) = backend.graphs
    assert not record.folded and len(record.blockers) == 2 and "cumsum" in str(record.blockers[0])
    assert "blocker:" in record.report


def test_options_through_torch_compile_are_refused(tiny):
    model, tokens, parents, cache = tiny
    with pytest.raises(Exception, match="options go to SpecFoldBackend"):
        torch.compile(model, backend=SpecFoldBackend(), options={"tau": 0.2})(tokens, parents, cache)
