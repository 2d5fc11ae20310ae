"""A tiny CPU training run through the real entry point: loss goes down, files are written, the
checkpoint loads back through the package loader with the same logits, the self-check runs."""

import json

import pytest
import torch

from specfold_compile.training.train import main

models = pytest.importorskip("specfold_compile.models")


def test_tiny_training_run(tmp_path):
    out = tmp_path / "ckpt"
    summary = main(["--out", str(out), "--size", "tiny", "--steps", "60", "--minutes", "5", "--batch-size", "12",
                    "--pool", "300", "--eval-n", "2", "--warmup", "10", "--log-every", "20", "--lr", "3e-3",
                    "--device", "cpu"])
    for name in ("config.json", "model.safetensors", "tokenizer.json", "train_summary.json", "prompt_format.json"):
        assert (out / name).is_file()
    hist = summary["loss_history"]
    assert summary["steps"] == 60
    assert hist[-1]["loss"] < hist[0]["loss"] - 1.0  # from ~ln(1024) = 6.9 downwards
    assert summary["reload_max_abs_diff"] < 1e-5
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Fast_dLLM_QwenForCausalLM"] and cfg["bd_size"] == 32
    assert cfg["mask_token_id"] == summary["special_tokens"]["mask_token_id"]
    loaded = models.from_pretrained(out)
    assert loaded.tokenizer is not None and loaded.tokenizer.token_to_id("<|mask|>") == cfg["mask_token_id"]
    assert set(summary["eval"]) == {"math", "code", "instruct"}
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in summary["eval"].values())
    on_disk = json.loads((out / "train_summary.json").read_text())
    assert on_disk["steps"] == 60 and "eval" in on_disk


def test_tokenizer_round_trip():
    from specfold_compile.tasks import TASKS, sample
    from specfold_compile.training.tokenizer import (build_tokenizer, decode_response, encode_prompt,
                                                     encode_response, special_ids)

    tok = build_tokenizer(1024, n_per_task=500)
    ids = special_ids(tok)
    assert tok.get_vocab_size() <= 1024
    for task in TASKS:
        for p in sample(task, "test", 100, seed=5):
            r = encode_response(tok, p.reference)
            assert decode_response(tok, r + [ids["eos_token_id"]] * 3, ids["eos_token_id"]) == p.reference
            assert all(t not in ids.values() for t in r)
            pr = encode_prompt(tok, p.prompt)
            assert pr[0] == ids["bos_token_id"] and pr[-1] == ids["sep_token_id"]
            assert tok.decode(pr[1:-1]) == p.prompt
    tricky = "def f(s):\n    return s[::-1]\n\n\t  x  = 1 | 2\n"
    assert tok.decode(tok.encode(tricky, add_special_tokens=False).ids) == tricky
