"""options={"inductor": True}: the rewritten graph lowered through Inductor computes the same function."""

import pytest
import torch

from specfold_compile.backend import collect_stats
from specfold_compile.backend.settings import Tuning
from specfold_compile.models import build
from specfold_compile.reference import folded_verify


def test_inductor_lowering_matches_reference_with_the_same_masks():
    pytest.importorskip("torch._inductor")
    model = build("tiny-nld", seed=3)
    cache = model.prefill(torch.arange(1, 12))
    block = model.config.block_size
    tokens = torch.randint(0, 90, (1, block), generator=torch.Generator().manual_seed(0)).repeat(4, 1)
    for n in range(1, 4):
        tokens[n, 2 * n] = 95  # each draft differs from its parent in one position
    parents = torch.tensor([-1, 0, 1, 0])
    compiled = torch.compile(model, backend="specfold", options={"tau": 0.3, "inductor": True, "kernels": "torch"})
    with collect_stats() as s:
        out = compiled(tokens, parents, cache)
    assert s.layers and 0 < s.recompute_ratio < 1  # the folded graph ran and folded something
    ref, _ = folded_verify(model, tokens, parents, cache, 0.3, fold_masks=s.fold_masks)
    assert float((out - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy scalar conversion inside the interpreter
@pytest.mark.parametrize("extra", [{}, {"fold_head": True}, {"gate": "sublayer"}, {"gate_flags": "graph"}],
                         ids=["default", "fold_head", "sublayer", "gate_flags_graph"])
def test_gpu_default_path_triton_kernels_under_inductor(extra, monkeypatch):
    """What backend="specfold" runs on CUDA by default: Triton kernels (interpreted here), Inductor
    lowering, packed linears split between the dense GEMM head and the count-aware spill kernel."""
    pytest.importorskip("torch._inductor")
    from specfold_compile import kernels

    if not kernels.triton_available():
        pytest.skip("triton is not importable here (or neither CUDA nor TRITON_INTERPRET=1)")
    torch._dynamo.reset()
    model = build("tiny-fast-dllm-v2", seed=5, num_layers=2)
    cache = model.prefill(torch.arange(1, 9))
    block = model.config.block_size
    tokens = torch.randint(0, 90, (1, block), generator=torch.Generator().manual_seed(1)).repeat(4, 1)
    for n in range(1, 4):
        tokens[n, 3 * n] = 95
    parents = torch.tensor([-1, 0, 1, 1])
    # tiny shapes: put the cuBLAS/Triton split inside the 4 x 16 packed rows
    tuning = Tuning(dense_fraction=0.3, dense_linear_min_rows=0, dense_linear_row_multiple=4)
    options = {"tau": 0.3, "inductor": True, "kernels": "triton", "tuning": tuning, **extra}
    compiled = torch.compile(model, backend="specfold", options=options)
    with collect_stats() as s:
        out = compiled(tokens, parents, cache)
    assert s.layers and 0 < s.recompute_ratio < 1
    ref, _ = folded_verify(model, tokens, parents, cache, 0.3, fold_masks=s.fold_masks,
                           gate=extra.get("gate", "layer"), fold_head=extra.get("fold_head", False))
    assert float((out - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.parametrize("combo_kernels, patches", [(False, None), (True, {"combo_kernels": True})])
def test_combo_kernels_reaches_inductor_config(combo_kernels, patches, monkeypatch):
    """options["combo_kernels"] is handed to Inductor as a config patch of this compile only (the
    global config stays as it was); without it Inductor compiles with its own defaults."""
    pytest.importorskip("torch._inductor")
    import torch._inductor.compile_fx as inductor_compile_fx

    seen = []

    def fake_compile_fx(gm, example_inputs, config_patches=None, **kwargs):
        seen.append(config_patches)
        return gm.forward  # the rewritten graph, run as it is: the test is about what Inductor is told

    monkeypatch.setattr(inductor_compile_fx, "compile_fx", fake_compile_fx)
    torch._dynamo.reset()
    model = build("tiny-nld", seed=3)
    cache = model.prefill(torch.arange(1, 12))
    tokens = torch.randint(0, 90, (3, model.config.block_size), generator=torch.Generator().manual_seed(2))
    parents = torch.tensor([-1, 0, 1])
    options = {"tau": 0.3, "inductor": True, "kernels": "torch", "combo_kernels": combo_kernels}
    out = torch.compile(model, backend="specfold", options=options)(tokens, parents, cache)
    assert seen == [patches]  # one graph (N > 1, every call folds on the CPU), lowered once
    assert out.shape == (3, model.config.block_size, model.config.vocab_size)
    assert torch._inductor.config.combo_kernels is False
