"""SPEC P1 per dtype (``specfold_compile.backend.SpecFoldSettings``'s docstring says the same).

At tau = 0 nothing folds and packing keeps every row, but the folded forward still rounds differently
from the dense one: the packed linears compute on gathered rows (the reference in float32, the Triton
path through cuBLAS and the count-aware GEMM), the attention correction merges two softmax states, the
packed SwiGLU rounds once where eager rounds twice, and Inductor fuses on the GPU. Hence:

* float32: logits equal dense within ~1e-6 relative, so SpecFold at tau = 0 decodes Spiffy's tokens
  unless an argmax or a threshold comparison is tied that closely: tested token for token on the trained
  model (and on random models in test_backend_hf_decoding.py);
* bf16 / fp16: logits equal dense within the dtype's rounding (tested here); that can flip a near-tied
  argmax, so tokens are not claimed equal. No option set is guaranteed to make the two forwards bitwise
  equal (it depends on the GEMM the device picks for each shape).
"""

import pytest
import torch

from specfold_compile.testing import ModelSpec, assert_close, make_cache, make_tree
from specfold_compile import loading
from specfold_compile.backend import SpecFoldBackend, collect_stats
from specfold_compile.decoding import generate


@pytest.mark.skipif(not loading.default_model_available(), reason="no trained model shipped")
def test_fp32_specfold_tau0_decodes_spiffy_tokens_on_the_trained_model():
    model = loading.load_model(None)
    assert model.embed_tokens.weight.dtype == torch.float32
    prompt = loading.encode(model, "What is 17 + 25?")
    kwargs = dict(mode="spiffy", max_new_tokens=40, draft_graph=loading.resolve_draft_graph(None, None))
    spiffy = generate(model, prompt, **kwargs)
    assert any(step.branches > 1 for step in spiffy.steps)
    with collect_stats() as s:
        folded = generate(torch.compile(model, backend=SpecFoldBackend(tau=0.0, kernels="torch")), prompt, **kwargs)
    assert s.calls > 0 and s.folded_rows == 0
    assert folded.tokens == spiffy.tokens and folded.nfe == spiffy.nfe
    assert [st.accepted for st in folded.steps] == [st.accepted for st in spiffy.steps]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_tau0_logits_equal_dense_within_rounding(dtype):
    model = ModelSpec(family="fast-dllm-v2", layers=2, block=8, seed=1).build().to(dtype)
    cache = make_cache(model)
    tokens, parents = make_tree(model, 5, "realistic", 3)
    with collect_stats() as s:
        out = torch.compile(model, backend=SpecFoldBackend(tau=0.0, kernels="torch"))(tokens, parents, cache)
    assert s.calls == 1 and s.folded_rows == 0
    assert_close(out, model(tokens, parents, cache), tol=2e-2, what=f"{dtype} tau = 0")
