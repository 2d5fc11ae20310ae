import json

import pytest
import torch

from decoding_fake_model import FakeModel
from specfold_compile.decoding import (
    calibrate, calibrate_cli, count_rank_sets, generate, load_draft_graph, record_traces,
)
import specfold_compile.decoding.calibration as cal_mod

PROMPTS = [[2, 3, 4], [7], [5, 5, 5, 5, 9], [0, 11], [3, 1, 4, 1, 5]]


@pytest.fixture(scope="module")
def traces():
    m = FakeModel(block_size=16, sub_block_size=8, vocab_size=32, seed=3)
    return m, record_traces(m, [torch.tensor(p) for p in PROMPTS], max_new_tokens=64)


def test_traces_shape(traces):
    m, tr = traces
    assert tr["block_size"] == 16 and tr["sub_block_size"] == 8 and tr["blocks"]
    for b in tr["blocks"]:
        assert len(b["states"]) == len(b["conf"]) + 1 == len(b["argmax"]) + 1
    json.dumps(tr)
    c = count_rank_sets(tr)
    assert c and all(k >= 1 and len(s) >= k for k, s in c)


@pytest.mark.parametrize("size", [1, 3, 8, 20])
def test_calibrate_valid_connected(traces, size):
    m, tr = traces
    g = calibrate(tr, size=size, max_level=4)
    assert len(g["nodes"]) == size
    dg = load_draft_graph(g, 16)
    keys = set(dg.nodes)
    assert len(keys) == size
    for (k, s), ps in zip(dg.nodes, dg.parents):
        assert k == 1 or len(ps) > 0
    # the most common level-1 rank set is kept
    c = count_rank_sets(tr, max_level=4, max_rank=15)
    top1 = max((n for n in c if n[0] == 1), key=lambda n: c[n])
    assert top1 in keys
    # lossless with the calibrated graph
    for p in PROMPTS[:3]:
        pr = torch.tensor(p)
        assert generate(m, pr, mode="spiffy", draft_graph=g, max_new_tokens=64).tokens == \
            generate(m, pr, max_new_tokens=64).tokens


def test_calibrate_pads_and_limits(traces):
    _, tr = traces
    g = calibrate({**tr, "blocks": []}, size=5, max_level=2, max_rank=3)
    assert len(g["nodes"]) == 5 and load_draft_graph(g, 16)
    with pytest.raises(ValueError, match="size"):
        calibrate(tr, size=0)
    with pytest.raises(ValueError, match="size 10"):
        calibrate({**tr, "blocks": []}, size=10, max_level=1, max_rank=3)  # only 7 subsets of {1,2,3}
    with pytest.raises(ValueError, match="max_rank"):
        calibrate(tr, size=4, max_rank=16)


def test_calibrate_cli(tmp_path, monkeypatch):
    m = FakeModel(block_size=8, sub_block_size=4, seed=1)
    monkeypatch.setattr(cal_mod, "_load_model", lambda spec, seed, device: m)
    pf = tmp_path / "prompts.jsonl"
    pf.write_text("[1, 2, 3]\n{\"prompt_ids\": [4, 5]}\n\n[6]\n")
    out = tmp_path / "g.json"
    assert calibrate_cli(["--model", "fake", "--prompts", str(pf), "--size", "6", "--out", str(out),
                          "--max-new-tokens", "32"]) == 0
    g = load_draft_graph(out, 8)
    assert len(g) == 6
    out2 = tmp_path / "g2.json"
    assert calibrate_cli(["--model", "fake", "--size", "4", "--out", str(out2), "--num-prompts", "3",
                          "--max-new-tokens", "16"]) == 0  # built-in prompts, no tokenizer -> random ids
    assert len(load_draft_graph(out2, 8)) == 4
