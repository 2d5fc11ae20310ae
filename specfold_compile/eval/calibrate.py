"""Calibration of the shipped model's draft graph from vanilla traces on the calib split."""

from __future__ import annotations

from pathlib import Path

from ..loading import DEFAULT_MODEL_DIR, encode, load_model

DEFAULT_DRAFT_GRAPH = DEFAULT_MODEL_DIR / "draft_graph.json"


def calibrate_default(model=None, *, n: int = 50, size: int = 16, seed: int = 0, max_new_tokens: int = 96,
                      threshold: float = 0.9, out: str | Path | None = DEFAULT_DRAFT_GRAPH) -> dict:
    """Record vanilla traces on ``n`` calib-split problems spread over the three tasks, calibrate a draft
    graph of ``size`` nodes and (``out``) save it. Returns the graph dict (plus ``"calibration"`` info)."""
    from ..decoding import calibrate, record_traces, save_draft_graph  # noqa: PLC0415
    from ..tasks import TASKS, sample  # noqa: PLC0415

    if model is None:
        model = load_model(None)
    per = [n // len(TASKS) + (1 if i < n % len(TASKS) else 0) for i in range(len(TASKS))]
    problems = [p for t, k in zip(TASKS, per) for p in sample(t, "calib", k, seed)]
    prompts = [encode(model, p.prompt) for p in problems]
    traces = record_traces(model, prompts, max_new_tokens=max_new_tokens, threshold=threshold)
    graph = calibrate(traces, size=size)
    if out is not None:
        save_draft_graph(graph, out)
    steps = sum(len(b["conf"]) for b in traces["blocks"])
    info = {"prompts": len(prompts), "per_task": dict(zip(TASKS, per)), "split": "calib",
            "blocks": len(traces["blocks"]), "steps": steps, "size": size}
    return {**graph, "calibration": info}
