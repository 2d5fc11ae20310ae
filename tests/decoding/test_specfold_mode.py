"""generate(mode="specfold"): Spiffy's decode through the verification forward compiled with the specfold
backend inside generate, kept per model and options; at tau = 0 (fp32) Spiffy's tokens."""

import pytest
import torch

from specfold_compile.backend import collect_stats
from specfold_compile.decoding import VerifyGraphs, generate, specfold_forward

OPTIONS = {"kernels": "torch"}
PROMPTS = [[2, 5, 6, 7, 9, 11, 3], list(range(3, 40)), [7]]


@pytest.fixture(scope="module", autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _ids(prompt, model):
    return torch.tensor([t % model.config.vocab_size for t in prompt], dtype=torch.long)


def test_tau0_decodes_spiffys_tokens_through_the_backend(model):
    for prompt in PROMPTS:
        ids = _ids(prompt, model)
        spiffy = generate(model, ids, mode="spiffy", max_new_tokens=40, draft_budget=8)
        with collect_stats() as stats:
            out = generate(model, ids, mode="specfold", tau=0.0, specfold_options=OPTIONS, max_new_tokens=40,
                           draft_budget=8)
        assert out.tokens == spiffy.tokens and out.nfe == spiffy.nfe and out.mode == "specfold"
        assert [s.parents for s in out.steps] == [s.parents for s in spiffy.steps]
        if max(s.branches for s in out.steps) > 1:  # multi-branch calls reached the folded graph
            assert stats.calls > 0 and stats.folded_rows == 0


def test_tau_reaches_the_backend(model):
    ids = _ids(PROMPTS[1], model)
    with collect_stats() as stats:
        generate(model, ids, mode="specfold", tau=1e9, specfold_options=OPTIONS, max_new_tokens=40, draft_budget=8)
    assert stats.calls > 0 and stats.folded_rows > 0  # a huge tau folds every row whose parent is nonzero


def test_the_compiled_forward_is_kept_per_model_and_options(model):
    first = specfold_forward(model, 0.0, OPTIONS)
    assert specfold_forward(model, 0, dict(OPTIONS)) is first
    assert specfold_forward(model, 0.5, OPTIONS) is not first
    assert specfold_forward(model, 0.0, {"kernels": "torch", "pack": False}) is not first
    kept = dict(model.__dict__["_specfold_forwards"])
    generate(model, _ids(PROMPTS[0], model), mode="specfold", tau=0.0, specfold_options=OPTIONS, max_new_tokens=8)
    assert model.__dict__["_specfold_forwards"] == kept  # no new compile for the same options
    assert "_specfold_forwards" not in dict(model.named_modules()) and not any(
        "specfold" in k for k in model.state_dict())


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), "0.1", True, [0.1]])
def test_bad_tau_is_one_line_naming_it(model, bad):
    with pytest.raises(ValueError) as err:
        generate(model, _ids(PROMPTS[0], model), mode="specfold", tau=bad, max_new_tokens=8)
    assert str(err.value).startswith("tau: expected a number >= 0") and "\n" not in str(err.value)


def test_specfold_arguments_outside_specfold_mode_and_bad_options(model):
    ids = _ids(PROMPTS[0], model)
    with pytest.raises(ValueError, match=r"^tau: only mode='specfold' compiles the model, got mode='spiffy'$"):
        generate(model, ids, mode="spiffy", tau=0.1)
    with pytest.raises(ValueError, match=r"^specfold_options: only mode='specfold'"):
        generate(model, ids, mode="vanilla", specfold_options=OPTIONS)
    with pytest.raises(ValueError, match=r"^specfold_options: pass the fold threshold as tau="):
        generate(model, ids, mode="specfold", specfold_options={"tau": 0.1})
    with pytest.raises(TypeError, match=r"^specfold_options: expected None or a dict"):
        generate(model, ids, mode="specfold", specfold_options=[("kernels", "torch")])
    with pytest.raises(TypeError, match=r"^specfold_options: expected hashable"):
        generate(model, ids, mode="specfold", specfold_options={"kernels": ["torch"]})


def test_specfold_with_verify_graphs(model):
    """The CUDA-graph runner's bookkeeping (replay="eager" on the CPU) with the compiled forward passed
    explicitly: Spiffy's tokens; a VerifyGraphs of the eager forward is refused for mode="specfold"."""
    ids = _ids(PROMPTS[1], model)
    spiffy = generate(model, ids, mode="spiffy", max_new_tokens=40, draft_budget=8)
    graphs = VerifyGraphs(model, replay="eager", forward=specfold_forward(model, 0.0, OPTIONS))
    out = generate(model, ids, mode="specfold", tau=0.0, specfold_options=OPTIONS, max_new_tokens=40,
                   draft_budget=8, cuda_graphs=graphs)
    assert out.tokens == spiffy.tokens and out.graph_captures > 0
    assert out.graph_captures + out.graph_replays == out.num_calls  # every call went through the graphs
    with pytest.raises(ValueError, match=r"^cuda_graphs: this VerifyGraphs was made for another model or forward"):
        generate(model, ids, mode="specfold", tau=0.0, specfold_options=OPTIONS,
                 cuda_graphs=VerifyGraphs(model, replay="eager"))
    with pytest.raises(TypeError, match=r"^forward: expected None or a callable"):
        VerifyGraphs(model, replay="eager", forward=0.1)
