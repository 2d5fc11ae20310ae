"""Train a small Fast-dLLM-v2-layout block-diffusion LM on the synthetic tasks (``bench/train.py``).

Time-boxed: ``--minutes`` is the whole run (data, training, saving, the accuracy self-check). With
``--steps`` the step count is fixed instead (and the run is reproducible from ``--seed`` up to GPU
kernel nondeterminism); a time-boxed run records the steps it took so it can be replayed with ``--steps``.
The layout (``layout.py``) puts every example's blocks on the absolute grid the decoder uses (Fast-dLLM v2
prompt handling: the prompt's whole blocks block-causal, its tail sharing the first decoded block).
Writes DIR/config.json, DIR/model.safetensors, DIR/tokenizer.json, DIR/tokenizer_config.json (with the
prompt format as its chat template), DIR/prompt_format.json and DIR/train_summary.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

from ..tasks import TASKS, format_prompt, sample, score_many
from ..tasks.sandbox import require_sandbox
from .decode import vanilla_decode
from .layout import Layout, fill_response, grid_blocks, layout_loss, make_batch
from .tokenizer import build_tokenizer, decode_response, encode_prompt, save_tokenizer, special_ids

BLOCK, SUB_BLOCK = 32, 8
MAX_POSITIONS = 4096

SIZES = {
    # ~3.8M parameters (tied embeddings), 15.2 MB of float32 weights.
    "small": dict(num_layers=6, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64, intermediate_size=512),
    # CPU tests.
    "tiny": dict(num_layers=2, hidden_size=64, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=128),
}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (checkpoint + summary)")
    ap.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget of the whole run")
    ap.add_argument("--steps", type=int, default=None, help="fixed number of steps (overrides the time box "
                    "for the schedule; the time box still stops the run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--pool", type=int, default=60_000, help="training problems per task (pre-generated)")
    ap.add_argument("--eval-n", type=int, default=50, help="held-out test problems per task for the self-check")
    ap.add_argument("--eval-reserve", type=float, default=45.0, help="seconds kept for saving + self-check")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--compile", action="store_true", help="torch.compile the training forward (off: eager)")
    ap.add_argument("--unsafe-run-code", action="store_true",
                    help="the self-check scores the code task without a sandbox where none can be built "
                         "(tasks/sandbox.py); without it a run on such a machine stops before training")
    return ap.parse_args(argv)


def log(msg: str) -> None:
    print(msg, flush=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def build_pool(tok, ids_: dict, n_per_task: int, seed: int):
    """Tokenized training problems: (prompt ids, response ids without eos, task) lists."""
    prompts, responses, tasks = [], [], []
    for task in TASKS:
        probs = sample(task, "train", n_per_task, seed)
        prompts += [format_prompt(p.prompt) for p in probs]
        responses += [p.reference for p in probs]
        tasks += [task] * len(probs)
    p_ids = [e.ids for e in tok.encode_batch(prompts, add_special_tokens=False)]
    r_ids = [e.ids for e in tok.encode_batch(responses, add_special_tokens=False)]
    return p_ids, r_ids, tasks


def pool_buckets(p_ids, r_ids, eos_id: int, device) -> dict:
    """Group examples by (whole prompt blocks, decoded blocks) on the absolute grid; one layout, one
    attention mask and one tensor pool per group (no padding: one-block examples never pay for longer
    ones)."""
    import numpy as np

    groups: dict[tuple[int, int], list[int]] = {}
    for i, (p, r) in enumerate(zip(p_ids, r_ids)):
        groups.setdefault(grid_blocks(len(p), len(r), BLOCK), []).append(i)
    buckets = {}
    for key, members in sorted(groups.items()):
        layout = Layout(*key, BLOCK)
        rows = np.empty((len(members), layout.T), dtype=np.int16)
        plen = np.empty(len(members), dtype=np.int64)
        for j, i in enumerate(members):
            p = p_ids[i]
            rows[j] = layout.row(p, fill_response(r_ids[i], len(p), eos_id, BLOCK))
            plen[j] = len(p)
        layout.tensors(device)
        buckets[key] = {"layout": layout, "rows": torch.from_numpy(rows).to(device),
                        "plen": torch.from_numpy(plen).to(device)}
    return buckets


def make_model(size: str, vocab_size: int, ids_: dict, seed: int, max_pos: int):
    from specfold_compile.models import build

    model = build("tiny-fast-dllm-v2", **SIZES[size], vocab_size=vocab_size, block_size=BLOCK,
                  sub_block_size=SUB_BLOCK, mask_token_id=ids_["mask_token_id"], eos_token_id=ids_["eos_token_id"],
                  bos_token_id=ids_["bos_token_id"], pad_token_id=ids_["pad_token_id"],
                  max_position_embeddings=max_pos, dtype=torch.float32, seed=seed, initializer_range=0.02,
                  tie_word_embeddings=True)
    return model


def lr_at(step: int, total: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    prog = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog)))


def evaluate(model, tok, ids_: dict, n: int, seed: int, device, max_blocks: int = 3,
             unsafe_run_code: bool = False) -> dict:
    model.eval()
    results = {}
    for task in TASKS:
        t0 = time.time()
        probs = sample(task, "test", n, seed)
        prompts = [encode_prompt(tok, p.prompt) for p in probs]
        outs, nfes = vanilla_decode(model, prompts, mask_id=ids_["mask_token_id"], eos_id=ids_["eos_token_id"],
                                    pad_id=ids_["pad_token_id"], block=BLOCK, sub_block=SUB_BLOCK,
                                    max_blocks=max_blocks)
        texts = [decode_response(tok, o, ids_["eos_token_id"]) for o in outs]
        ok = score_many(probs, texts, unsafe_run_code=unsafe_run_code)
        gen_tokens = [len(o[:o.index(ids_["eos_token_id"])]) if ids_["eos_token_id"] in o else len(o) for o in outs]
        results[task] = {"n": len(probs), "accuracy": sum(ok) / len(ok), "mean_nfe": sum(nfes) / len(nfes),
                         "mean_tokens": sum(gen_tokens) / len(gen_tokens), "seconds": round(time.time() - t0, 2),
                         "examples": [{"prompt": p.prompt, "response": t, "correct": c}
                                      for p, t, c in list(zip(probs, texts, ok))[:3]]}
    return results


def main(argv=None) -> dict:
    args = parse_args(argv)
    if not args.unsafe_run_code:  # the self-check runs model-written code: fail now, not after training
        require_sandbox()
    t_start = time.time()
    deadline = t_start + args.minutes * 60
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    seed_everything(args.seed)

    tok = build_tokenizer(args.vocab, seed=args.seed)
    ids_ = special_ids(tok)
    vocab_size = tok.get_vocab_size()
    p_ids, r_ids, _ = build_pool(tok, ids_, args.pool, args.seed)
    buckets = pool_buckets(p_ids, r_ids, ids_["eos_token_id"], device)
    keys = sorted(buckets)
    weights = [len(buckets[k]["rows"]) for k in keys]
    bucket_rng = random.Random(args.seed)
    log(f"[data] {len(p_ids)} training problems, "
        + ", ".join(f"{w} with {k[0]} prompt + {k[1]} decoded block(s) (T={buckets[k]['layout'].T})"
                    for k, w in zip(keys, weights))
        + f"; vocab {vocab_size}, setup {time.time() - t_start:.1f}s, device {device}")

    model = make_model(args.size, vocab_size, ids_, args.seed, max_pos=MAX_POSITIONS).to(device)
    model.train()
    model.requires_grad_(True)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"[model] {args.size}: {SIZES[args.size]} -> {n_params / 1e6:.2f}M parameters")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt_kw = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95), **opt_kw)
    fwd = torch.compile(model.forward_sequence) if args.compile else model.forward_sequence
    gen = torch.Generator(device=device).manual_seed(args.seed)
    def autocast():  # a fresh context per step
        if device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    train_deadline = deadline - args.eval_reserve
    total = args.steps or 10 ** 9
    history, running, n_run = [], 0.0, 0
    step = 0
    t_train = time.time()
    t_mark = None
    while step < total:
        now = time.time()
        if now >= train_deadline:
            log(f"[train] time box reached at step {step}")
            break
        if args.steps is None and step in (50, 300, 1000):
            # fix the schedule length from the measured step time (warm-up steps excluded)
            if step == 50:
                t_mark = (now, step)
            else:
                per_step = (now - t_mark[0]) / (step - t_mark[1])
                total = step + int((train_deadline - now) / per_step * 0.98)
                log(f"[train] {per_step * 1e3:.1f} ms/step -> schedule of {total} steps")
        if args.steps is None and step < 300 and total == 10 ** 9:
            sched_total = 10_000  # provisional, only the warm-up is used before the estimate
        else:
            sched_total = total
        lr = lr_at(step, sched_total, args)
        for g in opt.param_groups:
            g["lr"] = lr
        bk = buckets[bucket_rng.choices(keys, weights)[0]]  # one layout per batch
        idx = torch.randint(0, bk["rows"].shape[0], (args.batch_size,), device=device, generator=gen)
        inp, tgt, attn = make_batch(bk["rows"][idx], bk["plen"][idx], bk["layout"], ids_["mask_token_id"], gen)
        with autocast():
            logits = fwd(inp, bk["layout"].positions(device), attn)
        loss = layout_loss(logits, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        running += loss.item() if step % 10 == 0 or step <= 10 else 0.0
        n_run += 1 if step % 10 == 0 or step <= 10 else 0
        if step % args.log_every == 0 or step == 1:
            avg = running / max(1, n_run)
            history.append({"step": step, "loss": round(avg, 5), "lr": lr, "elapsed": round(time.time() - t_start, 1)})
            log(f"[train] step {step:6d} loss {avg:.4f} lr {lr:.2e} "
                f"{(time.time() - t_train) / step * 1e3:.1f} ms/step elapsed {time.time() - t_start:.0f}s")
            running, n_run = 0.0, 0
    train_seconds = time.time() - t_train

    model.eval()
    model.requires_grad_(False)
    model.save_pretrained(out)
    save_tokenizer(tok, out, MAX_POSITIONS)
    (out / "prompt_format.json").write_text(json.dumps({
        "prompt": "<|bos|>{prompt}<|sep|>", "response_end": "<|eos|>", **ids_,
        "block_size": BLOCK, "sub_block_size": SUB_BLOCK, "tasks": list(TASKS)}, indent=2) + "\n")
    weights_mb = (out / "model.safetensors").stat().st_size / 1e6
    log(f"[save] {out}: model.safetensors {weights_mb:.2f} MB, {step} steps in {train_seconds:.0f}s")

    summary = {"args": vars(args), "steps": step, "train_seconds": round(train_seconds, 1),
               "n_params": n_params, "weights_mb": round(weights_mb, 3), "model": SIZES[args.size],
               "special_tokens": ids_, "vocab_size": vocab_size, "layout": {"grid": "absolute", "block": BLOCK, "buckets": [
                   {"prompt_blocks": k[0], "decoded_blocks": k[1], "T": buckets[k]["layout"].T, "examples": w}
                   for k, w in zip(keys, weights)]},
               "loss_history": history, "final_loss": history[-1]["loss"] if history else None,
               "device": str(device), "torch": torch.__version__}
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    try:  # the checkpoint must load back through the package loader and give the same logits
        from specfold_compile.models import from_pretrained

        loaded = from_pretrained(out, device=device)
        x = torch.tensor([encode_prompt(tok, "Write 3 words about cats in lowercase, separated by ', '.")],
                         device=device)
        m = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=device).tril()
        pos = torch.arange(x.shape[1], device=device)
        diff = (loaded.forward_sequence(x, pos, m) - model.forward_sequence(x, pos, m)).abs().max().item()
        summary["reload_max_abs_diff"] = diff
    except Exception as e:  # record, never lose the checkpoint over it
        summary["reload_error"] = f"{type(e).__name__}: {e}"

    eval_results = evaluate(model, tok, ids_, args.eval_n, args.seed, device, unsafe_run_code=args.unsafe_run_code)
    summary["eval"] = eval_results
    summary["total_seconds"] = round(time.time() - t_start, 1)
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log("\n| task | n | vanilla acc | mean NFE | mean tokens |\n|---|---|---|---|---|")
    for task, r in eval_results.items():
        log(f"| {task} | {r['n']} | {r['accuracy'] * 100:.1f}% | {r['mean_nfe']:.1f} | {r['mean_tokens']:.1f} |")
    log(f"[done] total {summary['total_seconds']}s; summary in {out / 'train_summary.json'}")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
