"""P5 on the real tiny models (random weights, float32, CPU). Skipped only if the models cannot be imported."""

import pytest
import torch

try:
    from specfold_compile.models import build
except Exception as e:  # pragma: no cover - models being written alongside
    pytest.skip(f"specfold_compile.models unavailable: {e}", allow_module_level=True)

from specfold_compile.decoding import calibrate, generate, load_draft_graph, record_traces

PROMPTS = [[5, 6, 7, 8, 9], [20, 3, 44], [2, 90, 17, 33, 4, 61, 12]]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # tiny matmuls: thread oversubscription on a shared 2-core box costs 100x
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module", params=["tiny-fast-dllm-v2", "tiny-nld"])
def model(request):
    return build(request.param, seed=0)


def test_p5_real_tiny(model):
    tot_v = tot_s = 0
    for p in PROMPTS:
        p = torch.tensor(p, dtype=torch.long)
        for th in (0.9, 0.5):
            v = generate(model, p, max_new_tokens=48, threshold=th)
            s = generate(model, p, mode="spiffy", max_new_tokens=48, threshold=th, draft_budget=8)
            assert s.tokens == v.tokens
            assert s.nfe <= v.nfe
            tot_v += v.nfe
            tot_s += s.nfe
    assert tot_s < tot_v


def test_calibrated_graph_real_tiny(model):
    prompts = [torch.tensor(p, dtype=torch.long) for p in PROMPTS]
    tr = record_traces(model, prompts, max_new_tokens=48)
    B = model.config.block_size
    g = calibrate(tr, size=8, max_level=3)
    assert len(load_draft_graph(g, B)) == 8
    for p in prompts[:2]:
        v = generate(model, p, max_new_tokens=48)
        s = generate(model, p, mode="spiffy", draft_graph=g, draft_budget=5, max_new_tokens=48)
        assert s.tokens == v.tokens and s.nfe <= v.nfe
        assert max(st.branches for st in s.steps) <= 6
