"""What every evaluation report carries (versions, machine, model name) and the tables it prints."""

from __future__ import annotations

import math
import platform

import torch

from ..loading import DEFAULT_MODEL_DIR

MACHINE = "CPU, 2 shared cores (OMP_NUM_THREADS=1, torch.set_num_threads(1)); other jobs ran concurrently"


def versions() -> dict:
    try:
        import triton  # noqa: PLC0415

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - optional dependency
        triton_version = None
    return {"python": platform.python_version(), "torch": torch.__version__, "triton": triton_version,
            "platform": platform.platform()}


def machine(device: str) -> str:
    """How the report names where it ran: the CPU machine's description, else the device."""
    return MACHINE if device == "cpu" else device


def model_name(model, spec) -> str:
    if spec not in (None, "default"):
        return str(spec)
    return str(DEFAULT_MODEL_DIR) if getattr(model, "tokenizer", None) is not None else "tiny-fast-dllm-v2"


def jsonable(obj):
    """``obj`` with NaN and infinities as None (JSON has neither)."""
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def fmt(v, spec=".3f") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return format(v, spec)


def format_table(results: dict) -> str:
    """The eval table: one line per (task, mode)."""
    head = (f"{'task':<9} {'mode':<12} {'n':>4} {'accuracy':>8} {'NFE':>7} {'tokens/s':>9} {'acc/call':>8} "
            f"{'br/call':>7} {'recompute':>9}")
    lines = [head, "-" * len(head)]
    for task, per_mode in results.items():
        for mode, r in per_mode.items():
            lines.append(f"{task:<9} {mode:<12} {r['n']:>4} {fmt(r['accuracy']):>8} {fmt(r['nfe'], '.2f'):>7} "
                         f"{fmt(r['tokens_per_s'], '.1f'):>9} {fmt(r['accepted_per_call'], '.2f'):>8} "
                         f"{fmt(r['branches_per_call'], '.2f'):>7} {fmt(r['recompute_ratio']):>9}")
    return "\n".join(lines)


def format_sweep_table(rows, tasks) -> str:
    """The sweep table: one line per tau."""
    head = (f"{'tau':>5} " + " ".join(f"{'acc_' + t:>12}" for t in tasks)
            + f" {'tok/s':>7} {'recomp':>6} {'fold_agree':>10} {'fold_med':>8} {'fold_p99':>8}"
            f" {'copy_agree':>10} {'copy_med':>8} {'copy_p99':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['tau']:>5} " + " ".join(f"{fmt(r['accuracy_' + t]):>12}" for t in tasks)
                     + f" {fmt(r['tokens_per_s'], '.1f'):>7} {fmt(r['recompute_ratio']):>6}"
                     f" {fmt(r['fold_argmax_agree']):>10} {fmt(r['fold_relerr_median'], '.4f'):>8}"
                     f" {fmt(r['fold_relerr_p99'], '.4f'):>8} {fmt(r['copy_argmax_agree']):>10}"
                     f" {fmt(r['copy_relerr_median'], '.4f'):>8} {fmt(r['copy_relerr_p99'], '.4f'):>8}")
    return "\n".join(lines)
