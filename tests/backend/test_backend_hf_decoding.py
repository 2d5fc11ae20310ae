"""transformers models wrapped by ``from_hf`` under the backend, and lossless decoding at tau = 0."""
import re

import pytest
import torch
import torch._dynamo

from specfold_compile.decoding import generate
from specfold_compile.models.hf import from_hf
from specfold_compile.reference import folded_verify
from specfold_compile.testing import ModelSpec, assert_close, compile_run, make_cache, make_tree


def _tiny_hf(kind: str):
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**common, tie_word_embeddings=False)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:  # head_dim different from hidden/heads, no bias
        cfg = transformers.LlamaConfig(**common, head_dim=16, attention_bias=False)
        model = transformers.LlamaForCausalLM(cfg)
    return model.eval().requires_grad_(False)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_from_hf_folds_and_keeps_p1_p4(kind, tmp_path):
    wrapped = from_hf(_tiny_hf(kind), block_size=8)
    cache = make_cache(wrapped, seed=2)
    tokens, parents = make_tree(wrapped, 6, "realistic", 3)
    dense = wrapped(tokens, parents, cache)

    out0, s0, _ = compile_run(wrapped, tokens, parents, cache, tau=0.0, dump_dir=str(tmp_path), strict=True)
    report = (tmp_path / "graph_00" / "regions.txt").read_text()
    assert "decoder layers found: 2" in report, report
    assert "blocker" not in report and "not rewritten" not in report, report
    assert len(re.findall(r"rewritten: 1 gate\(s\), packed .*folded attention, kernels=torch, 6 packed linears",
                          report)) == 2, report
    assert s0.folded_rows == 0
    assert_close(out0, dense, what=f"{kind} P1")

    for gate in ("layer", "sublayer"):
        out, s, _ = compile_run(wrapped, tokens, parents, cache, tau=0.3, gate=gate)
        assert s.folded_rows > 0
        ref, _ = folded_verify(wrapped, tokens, parents, cache, 0.3, fold_masks=s.fold_masks, gate=gate)
        assert_close(out, ref, what=f"{kind} P4 gate={gate}")
        assert_close(out[:1], wrapped(tokens[:1], parents[:1], cache), what=f"{kind} P2")


# --- decoding ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["fast-dllm-v2", "nld"])
def test_specfold_tau0_decodes_spiffy_tokens(family):
    model = ModelSpec(family=family, layers=2, block=8, seed=7).build()
    prompt = torch.tensor([1, 5, 9, 2, 7, 3], dtype=torch.int64)
    kwargs = dict(mode="spiffy", max_new_tokens=model.config.block_size + 4, threshold=0.9, draft_budget=6,
                  stop_at_eos=False)
    eager = generate(model, prompt, **kwargs)
    assert any(step.branches > 1 for step in eager.steps), "Spiffy must verify drafts"
    from specfold_compile.backend import collect_stats

    compiled = torch.compile(model, backend="specfold", options={"tau": 0.0})
    with collect_stats() as s:
        folded = generate(compiled, prompt, **kwargs)
    # Every multi-branch verification ran the folded graph; N = 1 calls (nothing to fold) run the plain one.
    assert s.calls == sum(step.branches > 1 for step in folded.steps) > 0
    assert s.folded_rows == 0
    assert folded.tokens == eager.tokens
    assert folded.nfe == eager.nfe
    assert [st.branches for st in folded.steps] == [st.branches for st in eager.steps]
    assert [st.accepted for st in folded.steps] == [st.accepted for st in eager.steps]
