"""The headline of the committed GPU results (``bench/results/<gpu>/*.json``), read from the JSON.

Two numbers say what SpecFold buys on a GPU, each with the hardware and versions it was measured on:

* per verification call (``per_check.json``): a call with Spiffy's default branch count (draft budget
  + the main row), replayed from a CUDA graph, at the recompute ratio closest to the one asked for,
  against the dense eager forward and dense under Inductor, over every model shape and prefix measured;
* end to end (``end_to_end.json``, ``python -m bench.end_to_end``): measured decoding of the shipped
  model, SpecFold in the device loop against Spiffy under Inductor in the same loop, over every task.

The results live in the source tree (``bench/``), not in an installed wheel: where they are missing or
unreadable the headline says so instead of a number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..decoding.defaults import DEFAULTS

RESULTS_DIR = Path(__file__).resolve().parents[2] / "bench" / "results" / "h200"
HEADLINE_BRANCHES = DEFAULTS.draft_budget + 1   # Spiffy's default call: the main row and its drafts


@dataclass(frozen=True)
class Headline:
    """Printable lines of the committed GPU results; ``lines`` is empty and ``missing`` says why where
    there are none."""

    hardware: str
    lines: tuple[str, ...]
    missing: str = ""


def _load(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("rows"), list) else None


def _hardware(versions: dict) -> str:
    keys = (("gpu", "{}"), ("torch", "torch {}"), ("triton", "triton {}"), ("driver", "driver {}"))
    return ", ".join(form.format(versions[k]) for k, form in keys if versions.get(k))


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"


# The recompute ratio SpecFold's default options reach on the shipped model's task suite
# (``specfold eval``, bench/results/eval/eval.json: 0.14-0.21 by task): the per-call number quoted by default.
DEFAULT_RATIO = 0.19


def per_check_line(per_check: dict, ratio: float) -> str | None:
    """SpecFold's replayed call time over dense eager and dense Inductor at ``HEADLINE_BRANCHES``."""
    rows = [r for r in per_check["rows"] if r.get("cuda_graph") and r.get("n_branches") == HEADLINE_BRANCHES
            and isinstance(r.get("ms"), (int, float))]
    folded = [r for r in rows if r.get("mode") == "specfold"]
    if not folded:
        return None
    measured = sorted({r["recompute_ratio"] for r in folded})
    chosen = min(measured, key=lambda x: abs(x - ratio))
    by_shape: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r["mode"] in ("dense", "dense_compiled") or (r["mode"] == "specfold" and r["recompute_ratio"] == chosen):
            by_shape.setdefault((r.get("model"), r.get("prefix")), {})[r["mode"]] = r["ms"]
    eager = [t["specfold"] / t["dense"] for t in by_shape.values() if {"specfold", "dense"} <= set(t)]
    inductor = [t["specfold"] / t["dense_compiled"] for t in by_shape.values() if {"specfold", "dense_compiled"} <= set(t)]
    if not eager or not inductor:
        return None
    models = sorted({m for m, _ in by_shape if m})
    prefixes = sorted({p for _, p in by_shape if p is not None})
    return (f"one verification call, N = {HEADLINE_BRANCHES} branches, recompute ratio {chosen:.2f}, replayed "
            f"from a CUDA graph: {_span(eager)} the time of the dense eager forward, {_span(inductor)} dense "
            f"under Inductor ({', '.join(models)}; prefix {', '.join(map(str, prefixes))})")


def end_to_end_line(end_to_end: dict) -> str | None:
    """Measured decoding speed (``python -m bench.end_to_end``): SpecFold in the device loop against Spiffy
    under Inductor in the same loop, and the device loop against the Python loop."""
    speed: dict[str, dict[str, float]] = {}
    for r in end_to_end.get("rows", []):
        if not r.get("trace_driven") and isinstance(r.get("tokens_per_s"), (int, float)):
            speed.setdefault(r.get("task"), {})[r.get("mode")] = r["tokens_per_s"]
    fold = [s["specfold_device"] / s["spiffy_compiled_device"] for s in speed.values()
            if {"specfold_device", "spiffy_compiled_device"} <= set(s)]
    loop = [s["specfold_device"] / s["specfold"] for s in speed.values() if {"specfold_device", "specfold"} <= set(s)]
    if not fold or not loop:
        return None
    model = next((r.get("model") for r in end_to_end["rows"] if r.get("model")), "the shipped model")
    return (f"decoding {model} (measured, CUDA graphs): SpecFold in the device loop at {_span(fold)} the "
            f"tokens/s of Spiffy under Inductor in the same loop, the device loop at {_span(loop)} the Python "
            f"loop's (tasks {', '.join(sorted(speed))})")


def gpu_headline(results_dir: str | Path | None = None, recompute_ratio: float | None = None) -> Headline:
    """The headline of the results in ``results_dir`` (default: the repository's ``RESULTS_DIR``).
    ``recompute_ratio``: pick the per-call number nearest to it (default: ``DEFAULT_RATIO``)."""
    folder = Path(results_dir) if results_dir is not None else RESULTS_DIR
    per_check, end_to_end = _load(folder / "per_check.json"), _load(folder / "end_to_end.json")
    if per_check is None and end_to_end is None:
        return Headline("", (), f"no committed GPU results readable in {folder} (they are in the source "
                                f"repository's bench/results, not in an installed package)")
    ratio = recompute_ratio if recompute_ratio is not None else DEFAULT_RATIO
    lines = []
    hardware = ""
    for data, line in ((per_check, per_check and per_check_line(per_check, ratio)),
                       (end_to_end, end_to_end and end_to_end_line(end_to_end))):
        if line:
            lines.append(line)
            hardware = hardware or _hardware(data.get("versions") or {})
    if not lines:
        return Headline("", (), f"the results in {folder} hold no per-call or end-to-end rows to quote")
    return Headline(hardware or "GPU (versions not recorded)", tuple(lines))
