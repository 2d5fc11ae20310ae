"""Invalid ``parents`` in a compiled call: eager and launched compiled ``model(...)`` calls raise (their
data checks read the values back on the host); a call captured into a CUDA graph cannot read them back,
so its gates compute every row whose parent is invalid (exactly the dense forward's logits for it), never
read a row through an invalid parent, and set a device flag that ``invalid_parents_seen`` and
``collect_stats`` report."""

import pytest
import torch

from specfold_compile.testing import ModelSpec, assert_close, compile_run, make_cache, make_tree
from specfold_compile.backend import invalid_parents_seen

KERNELS = [{"kernels": "torch"}, {"kernels": "triton"}, {"kernels": "triton", "gate_flags": "graph"}]


@pytest.fixture
def captured_checks(monkeypatch):
    """The data checks as while a CUDA graph is captured (no host read, so none run), on the CPU."""
    from specfold_compile.models import transformer

    monkeypatch.setattr(transformer, "check_values", lambda *args, **kwargs: None)


@pytest.fixture(scope="module")
def tiny():
    model = ModelSpec(family="nld", layers=2, block=8, seed=3).build()
    cache = make_cache(model, seed=1)
    tokens, _ = make_tree(model, 4, "realistic", 5)
    return model, tokens, cache


@pytest.mark.parametrize("options", KERNELS, ids=lambda o: "-".join(o.values()))
def test_all_parents_invalid_gives_the_dense_result(tiny, options, captured_checks):
    model, tokens, cache = tiny
    parents = torch.tensor([0, 7, -2, 3])  # row 0 not -1; 7 and 3 not below their row; -2 negative
    dense = model.verify(tokens, parents, cache)  # the unchecked forward: parents do not enter it
    invalid_parents_seen()  # reset
    out, s, _ = compile_run(model, tokens, parents, cache, tau=0.9, **options)
    assert not any(m.any() for m in s.fold_masks), "a row folded onto an invalid parent"
    assert_close(out, dense, what="invalid parents vs dense")
    assert s.invalid_parent_calls == 1
    assert invalid_parents_seen() and not invalid_parents_seen()  # read, then reset


@pytest.mark.parametrize("options", KERNELS, ids=lambda o: "-".join(o.values()))
def test_an_invalid_parent_is_computed_and_the_rest_fold(tiny, options, captured_checks):
    model, tokens, cache = tiny
    tokens = tokens.clone()
    tokens[3] = tokens[2]  # row 3 repeats row 2, its (valid) parent
    parents = torch.tensor([-1, 0, 9, 2])  # row 2's parent is out of range
    dense = model.verify(tokens, parents, cache)
    invalid_parents_seen()
    out, s, _ = compile_run(model, tokens, parents, cache, tau=0.9, **options)
    assert not any(m[2].any() for m in s.fold_masks)
    assert s.fold_masks[0][3].all() and s.fold_masks[0][1].any(), "valid parents must still fold"
    assert_close(out[2], dense[2], what="the row with an invalid parent")
    assert s.invalid_parent_calls == 1 and invalid_parents_seen()
    out, s, _ = compile_run(model, tokens, torch.tensor([-1, 0, 1, 2]), cache, tau=0.9, **options)
    assert s.invalid_parent_calls == 0 and not invalid_parents_seen()


def test_the_flag_works_in_and_out_of_inference_mode(monkeypatch):
    """The flag is made on first use, which may be inside inference mode (``generate`` decodes in it):
    it must stay a normal tensor that later calls outside inference mode can update."""
    from specfold_compile.ops import fold_ops

    monkeypatch.setattr(fold_ops, "_INVALID_PARENTS", {})
    h = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(0))
    gate = lambda parents: torch.ops.specfold.fold_gate(h, parents, torch.tensor(0.5), 0, True, "torch")  # noqa: E731
    with torch.inference_mode():
        gate(torch.tensor([-1, 0, 1]))
    gate(torch.tensor([-1, 0, 5]))
    assert invalid_parents_seen()


def test_launched_calls_reject_invalid_parents(tiny):
    """Outside a capture, eager and compiled calls check the parents on the host first."""
    model, tokens, cache = tiny
    parents = torch.tensor([0, 7, -2, 3])
    with pytest.raises(ValueError, match="^parents"):
        model(tokens, parents, cache)
    with pytest.raises(ValueError, match="^parents"):
        compile_run(model, tokens, parents, cache, tau=0.9, kernels="torch")
