"""fuse_projections (the models' default): q/k/v and gate/up as one GEMM each, same outputs as the part
modules (``fuse_projections=False``), checkpoint names unchanged."""
from __future__ import annotations

import pytest
import torch

from specfold_compile.models import build, from_pretrained, save_checkpoint

FAMILIES = ["tiny-fast-dllm-v2", "tiny-nld"]
PROMPT = torch.tensor([5, 6, 7, 8, 9])


def _call(model, seed=0):
    """prefill, a verification call of 4 rows and a block write: every path through the projections."""
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    with torch.no_grad():
        cache = model.prefill(PROMPT)
        tokens = torch.randint(0, cfg.vocab_size, (4, cfg.block_size), generator=gen)
        logits = model(tokens, torch.tensor([-1, 0, 0, 1]), cache)
        written = model.write_block(cache, tokens[0])
    return [cache.next_logits, logits, written.next_logits, *written.keys, *written.values]


@pytest.mark.parametrize("name", FAMILIES)
def test_fused_matches_unfused_and_keeps_the_names(name):
    plain, fused = build(name, seed=0, fuse_projections=False), build(name, seed=0)
    assert hasattr(plain.layers[0].self_attn, "q_proj") and hasattr(plain.layers[0].mlp, "gate_proj")
    layer = fused.layers[0]
    assert hasattr(layer.self_attn, "qkv_proj") and not hasattr(layer.self_attn, "q_proj")
    assert hasattr(layer.mlp, "gate_up_proj") and not hasattr(layer.mlp, "gate_proj")
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in fused.parameters())
    a, b = plain.state_dict(), fused.state_dict()
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    for x, y in zip(_call(plain), _call(fused)):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    assert fused.fuse_projections() is fused  # idempotent
    assert set(fused.state_dict()) == set(a)


@pytest.mark.parametrize("name", FAMILIES)
def test_fused_loads_and_saves_checkpoints(name, tmp_path):
    """Weights written into the parts' names land in the fused tensors: load_state_dict, and
    checkpoints both ways between fused and unfused models."""
    source = build(name, seed=1, fuse_projections=False)
    fused = build(name, seed=2)
    fused.load_state_dict(source.state_dict())
    for x, y in zip(_call(source), _call(fused)):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    save_checkpoint(fused, tmp_path / "fused")
    reloaded = from_pretrained(tmp_path / "fused", fuse_projections=False)  # from the fused model's checkpoint
    assert hasattr(reloaded.layers[0].self_attn, "q_proj")
    save_checkpoint(source, tmp_path / "plain")
    refused = from_pretrained(tmp_path / "plain")  # fused by default
    assert hasattr(refused.layers[0].self_attn, "qkv_proj") and hasattr(refused.layers[0].mlp, "gate_up_proj")
    for x, y, z in zip(_call(source), _call(reloaded), _call(refused)):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x, z, rtol=1e-5, atol=1e-5)


def test_fused_converts_dtype_with_the_model():
    fused = build("tiny-fast-dllm-v2", seed=0).to(torch.float64)
    assert fused.layers[0].self_attn.qkv_proj.weight.dtype == torch.float64
    assert all(t.dtype == torch.float64 for k, t in fused.state_dict().items() if "proj" in k)


def test_fuse_rejects_foreign_layers():
    model = build("tiny-fast-dllm-v2", seed=0, fuse_projections=False)
    model.layers[0].mlp = torch.nn.Sequential(torch.nn.Linear(4, 4))  # not the package's MLP
    with pytest.raises(TypeError, match="fuse_projections"):
        model.fuse_projections()


@pytest.mark.parametrize("name,kernels", [("tiny-fast-dllm-v2", "torch"), ("tiny-nld", "torch"),
                                          ("tiny-fast-dllm-v2", "triton")])
def test_backend_folds_a_fused_model(name, kernels):
    """The passes follow the fused projections (one linear, split along the last dim): every layer
    is gated in strict mode and the folded output equals the unfused model's folded output (Triton
    kernels: in the interpreter on the CPU)."""
    import specfold_compile

    if kernels == "triton":
        pytest.importorskip("triton")
        from specfold_compile.kernels import triton_available

        if not triton_available():
            pytest.skip("needs TRITON_INTERPRET=1 or a GPU")

    plain, fused = build(name, seed=0, fuse_projections=False), build(name, seed=0)
    gen = torch.Generator().manual_seed(3)
    B = plain.config.block_size
    rows = [torch.randint(0, plain.config.vocab_size, (B,), generator=gen)]
    parents = [-1, 0, 0, 1, 2]
    for p in parents[1:]:
        row = rows[p].clone()
        row[torch.randint(0, B, (2,), generator=gen)] = 7
        rows.append(row)
    tokens, parents = torch.stack(rows), torch.tensor(parents)
    outs, stats = [], []
    for model in (plain, fused):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="specfold",
                                 options={"tau": 0.3, "strict": True, "kernels": kernels})
        with torch.no_grad(), specfold_compile.collect_stats() as s:
            outs.append(compiled(tokens, parents, model.prefill(PROMPT)))
        stats.append(s)
    assert len(stats[1].layers) == plain.config.num_layers
    assert stats[0].recompute_ratio == stats[1].recompute_ratio < 1.0
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
