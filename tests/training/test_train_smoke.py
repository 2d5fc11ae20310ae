"""A tiny CPU training run through the real entry point: loss goes down, files are written, the
checkpoint loads back through the package loader with the same logits, its tokenizer loads through
transformers with the prompt format as chat template, the self-check runs."""

import json

import pytest

from specfold_compile import models
from specfold_compile.tasks import format_prompt
from specfold_compile.training.train import main


def test_tiny_training_run(tmp_path):
    out = tmp_path / "ckpt"
    summary = main(["--out", str(out), "--size", "tiny", "--steps", "60", "--minutes", "5", "--batch-size", "12",
                    "--pool", "300", "--eval-n", "2", "--warmup", "10", "--log-every", "20", "--lr", "3e-3",
                    "--device", "cpu"])
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "train_summary.json",
                 "prompt_format.json"):
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
    buckets = on_disk["layout"]["buckets"]
    assert on_disk["layout"]["grid"] == "absolute" and sum(b["examples"] for b in buckets) == 3 * 300
    assert {(b["prompt_blocks"], b["decoded_blocks"]) for b in buckets} >= {(0, 2), (1, 1)}
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(out)
    prompt = "Write 3 words about cats in lowercase, separated by ', '."
    text = hf.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    assert text == format_prompt(prompt)


def test_training_without_a_sandbox_stops_before_any_work(tmp_path, monkeypatch):
    """The self-check scores model-written code: where no sandbox can be built the run stops at once
    (naming --unsafe-run-code), not after minutes of training."""
    from specfold_compile.tasks import sandbox

    monkeypatch.setattr(sandbox, "_bwrap", lambda: None)
    with pytest.raises(sandbox.SandboxUnavailable, match="unsafe-run-code"):
        main(["--out", str(tmp_path / "ckpt"), "--size", "tiny", "--steps", "1", "--device", "cpu"])
    assert not (tmp_path / "ckpt").exists()
