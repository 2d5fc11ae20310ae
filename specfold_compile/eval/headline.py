"""The headline of the committed GPU results (``bench/results/<gpu>/*.json``), read from the JSON.

Two numbers say what SpecFold buys on a GPU, each with the hardware and versions it was measured on:

* per verification call (``per_check.json``): a call with Spiffy's default branch count (draft budget
  + the main row), replayed from a CUDA graph, at the recompute ratio closest to the one asked for,
  against the dense eager forward and dense under Inductor, over every model shape and prefix measured;
* end to end (``end_to_end.json``): decoding projected through the measured per-call latencies,
  SpecFold against Spiffy eager and Spiffy under Inductor, over every shape and task.

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


def _measured_ratio(end_to_end: dict | None) -> float | None:
    """The mean recompute ratio of the folded decoding runs in ``end_to_end.json``."""
    ratios = [r["recompute_ratio"] for r in (end_to_end or {}).get("rows", [])
              if isinstance(r.get("recompute_ratio"), (int, float))]
    return sum(ratios) / len(ratios) if ratios else None


def per_check_line(per_check: dict, ratio: float | None) -> str | None:
    """SpecFold's replayed call time over dense eager and dense Inductor at ``HEADLINE_BRANCHES``."""
    rows = [r for r in per_check["rows"] if r.get("cuda_graph") and r.get("n_branches") == HEADLINE_BRANCHES
            and isinstance(r.get("ms"), (int, float))]
    folded = [r for r in rows if r.get("mode") == "specfold"]
    if not folded:
        return None
    measured = sorted({r["recompute_ratio"] for r in folded})
    chosen = min(measured, key=lambda x: abs(x - ratio)) if ratio is not None else measured[len(measured) // 2]
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
    """Projected decoding speed of SpecFold over Spiffy eager and Spiffy under Inductor."""
    speed: dict[tuple, dict[str, float]] = {}
    for r in end_to_end["rows"]:
        if r.get("kind") == "projected" and isinstance(r.get("projected_tokens_per_s"), (int, float)):
            speed.setdefault((r.get("shape"), r.get("task")), {})[r.get("mode")] = r["projected_tokens_per_s"]
    eager = [s["specfold"] / s["spiffy"] for s in speed.values() if {"specfold", "spiffy"} <= set(s)]
    inductor = [s["specfold"] / s["spiffy_compiled"] for s in speed.values() if {"specfold", "spiffy_compiled"} <= set(s)]
    if not eager or not inductor:
        return None
    shapes = sorted({shape for shape, _ in speed if shape})
    tasks = sorted({task for _, task in speed if task})
    return (f"decoding (projected through the measured call latencies): SpecFold at {_span(eager)} the tokens/s "
            f"of Spiffy eager, {_span(inductor)} of Spiffy under Inductor ({', '.join(shapes)}; tasks "
            f"{', '.join(tasks)})")


def gpu_headline(results_dir: str | Path | None = None, recompute_ratio: float | None = None) -> Headline:
    """The headline of the results in ``results_dir`` (default: the repository's ``RESULTS_DIR``).
    ``recompute_ratio``: pick the per-call number nearest to it (default: what the committed decoding
    runs measured)."""
    folder = Path(results_dir) if results_dir is not None else RESULTS_DIR
    per_check, end_to_end = _load(folder / "per_check.json"), _load(folder / "end_to_end.json")
    if per_check is None and end_to_end is None:
        return Headline("", (), f"no committed GPU results readable in {folder} (they are in the source "
                                f"repository's bench/results, not in an installed package)")
    ratio = recompute_ratio if recompute_ratio is not None else _measured_ratio(end_to_end)
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
