"""The decode loop's host work per verification call: what ``bench.project``, which counts GPU time
only, leaves out of projected tokens/s.

Decodes task problems with the trained tiny model (Spiffy, its calibrated draft graph, draft budget 16,
CPU, as the end_to_end suite decodes) and splits the wall
time of each run into: the model's forwards (verification calls, and prefill + block writes apart),
``_verify``'s own host work around the forward (masked positions, confidence, the copy back), the
drafts (``build_drafts``) and the rest of the loop (commit walk, finished checks, stacking rows). The
drafts are also replayed alone on the recorded inputs (best of 7 passes: ms per draft build, the number
to compare between commits on a noisy machine). Also: the share of the rows of multi-branch calls whose
logits the decoder asks for (the masked positions: what the LM head computes).
Everything but the forwards runs on the host whatever the model's size, so on a GPU it adds to every
call unless it overlaps the GPU's work (the decode loop is synchronous: it does not).

    python -m bench.host_overhead [--tasks math,code,instruct] [--limit 8] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

import specfold_compile.decoding.decoder as decoder
from bench.common import check_output


class _Timed:
    """Accumulates seconds per key around wrapped callables."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls = 0

    def wrap(self, key: str, fn, count: bool = False):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0
                self.calls += count
        return timed


class _TimedModel:
    """The model as the decoder sees it, its forwards and writes timed; counts the rows of multi-branch
    calls and the logits the decoder asks for there (``logit_positions``)."""

    def __init__(self, model, timed: _Timed) -> None:
        self.config = model.config
        self.forward = timed.wrap("forward", model, count=True)
        self.prefill = timed.wrap("writes", model.prefill)
        self.write_block = timed.wrap("writes", model.write_block)
        self.multi_rows = self.multi_logit_rows = 0

    def __call__(self, tokens, parents, cache, logit_positions=None):
        if tokens.shape[0] > 1:
            self.multi_rows += tokens.numel()
            self.multi_logit_rows += tokens.numel() if logit_positions is None else logit_positions.numel()
        return self.forward(tokens, parents, cache, logit_positions=logit_positions)


def measure(model, problems, graph, budget: int = 16) -> dict:
    """Mean ms per verification call of each part over decoding ``problems`` with draft ``graph`` (after
    one warm-up; prompts encoded and the graph loaded beforehand)."""
    from specfold_compile.loading import encode

    prompts = [encode(model, p.prompt) for p in problems]
    kwargs = {"mode": "spiffy", "max_new_tokens": 96, "draft_budget": budget, "draft_graph": graph}
    decoder.generate(model, prompts[0], **kwargs)  # warm-up
    timed = _Timed()
    target = _TimedModel(model, timed)
    saved = decoder._verify, decoder.build_drafts
    recorded = []  # build_drafts' inputs, replayed below

    def record(*args, **kw):
        recorded.append((args, kw))
        return saved[1](*args, **kw)

    decoder._verify = timed.wrap("verify", decoder._verify)
    decoder.build_drafts = timed.wrap("drafts", record)
    try:
        t0 = time.perf_counter()
        for ids in prompts:
            decoder.generate(target, ids, **kwargs)
        wall = time.perf_counter() - t0
    finally:
        decoder._verify, decoder.build_drafts = saved
    # The drafts alone, replayed on the recorded inputs: best of 7 passes (a low-noise number for A/B runs)
    replay = min(_seconds(lambda: [saved[1](*a, **kw) for a, kw in recorded]) for _ in range(7))
    s, calls = timed.seconds, max(1, timed.calls)
    # prefill calls write_block: count the writes once, through the outermost wrapper only
    parts = {"forward": s.get("forward", 0.0), "verify_host": s.get("verify", 0.0) - s.get("forward", 0.0),
             "drafts": s.get("drafts", 0.0)}
    parts["loop"] = wall - s.get("verify", 0.0) - parts["drafts"] - s.get("writes", 0.0)
    return {"calls": timed.calls, **{f"{k}_ms_per_call": 1e3 * v / calls for k, v in parts.items()},
            "host_ms_per_call": 1e3 * (parts["verify_host"] + parts["drafts"] + parts["loop"]) / calls,
            "draft_builds": len(recorded), "drafts_replay_ms_per_build": 1e3 * replay / max(1, len(recorded)),
            "masked_share_multi_branch": target.multi_logit_rows / max(1, target.multi_rows)}


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    from specfold_compile.decoding import load_draft_graph
    from specfold_compile.loading import DEFAULT_MODEL_DIR, load_model
    from specfold_compile.tasks import TASKS, sample

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--limit", type=int, default=8, help="test-split problems per task")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    if args.out:
        check_output(ap, args.out)
    torch.set_num_threads(1)
    model = load_model(None, device="cpu")
    graph = load_draft_graph(DEFAULT_MODEL_DIR / "draft_graph.json", model.config.block_size)  # the shipped one
    rows = []
    for task in args.tasks.split(","):
        rows.append({"task": task, **measure(model, sample(task, "test", args.limit), graph)})
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()}), flush=True)
    if args.out:
        info = {"python": platform.python_version(), "torch": torch.__version__, "cpu": platform.processor(),
                "threads": torch.get_num_threads()}
        Path(args.out).write_text(json.dumps({"versions": info, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
