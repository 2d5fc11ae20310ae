"""Projected tokens/s: replay decoding runs' verification calls through per-check latencies.

The trained model is tiny and launch-bound, so its own tokens/s says little about a real model. Each
end_to_end run records every verification call it made (branch count N, measured recompute ratio);
this module sums, per run, the latency of each call at a real shape, read from per_check rows measured
on the GPU, plus one block write for every other forward (prefill and block writes; the prompt's
prefill is charged as one block write). A write costs the ``write`` row (eager) or, for runs that
decoded with ``generate(compile_writes=True)``, the ``write_compiled`` row (under torch.compile's default
backend; both from ``bench.run --suite writes``, merged into per_check.json); without those rows, one
dense eager N = 1 forward. A call costs:
  - vanilla / Spiffy: dense eager at its N (interpolated between measured Ns);
  - SpecFold: what ``backend="specfold"`` runs with its default options. Where its cost model does not
    fold a call of N branches at this shape (``backend_folds``), the plain graph: dense under Inductor
    (at N = 1 the specfold row per_check measured, when there is one). Where it folds, SpecFold's folded
    rows, interpolated in the recompute ratio and in N between measured branch counts. The calls and
    ratios come from the run that folds every multi-branch call (``specfold_fold_all``) when there is
    one: on the tiny model the default folds nothing, so only that run has ratios to replay;
  - ``spiffy_compiled``: Spiffy with its verification calls (and its writes, when the table has
    ``write_compiled``) under ``torch.compile``'s default backend, the fair baseline for a compiled
    SpecFold. Projected from the measured ``spiffy_compiled`` run, or else as an extra row of the Spiffy
    run, when per_check has ``dense_compiled`` from N = 1 to the run's largest N.
The result is labelled "projected" everywhere it appears.

``python -m bench.project END_TO_END.json PER_CHECK.json`` replaces the projected rows of END_TO_END.json
with ones computed from PER_CHECK.json (prefix 512) and prints them. ``--specfold-from RUN.json``
(repeatable) projects SpecFold with another configuration's latencies (an ablation run, e.g. another
``--dense-fraction``): RUN's SpecFold rows replace every SpecFold row of the same model, prefix and N
(all its ratios, so no ratio of the two configurations is interpolated with the other's; a call whose N
lies between one of RUN's Ns and one it did not measure still interpolates between the two).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import check_output
from specfold_compile.backend import SpecFoldSettings
from specfold_compile.backend.dispatch import cost_model_folds
from specfold_compile.models.config import PRESETS

SHAPES = ("fast-dllm-v2-1.5b", "fast-dllm-v2-7b")
# Which per_check field a projection charges: CUDA-graph replays, or plain calls each waited for (what a
# decode loop without CUDA graphs, such as ``generate``, pays; bench.common.time_launched).
LATENCIES = ("ms", "launched_ms")


def backend_folds(shape: str, n: int) -> bool:
    """Whether ``backend="specfold"`` (default options, on the GPU) folds a call of n branches at this
    model shape (bf16 weights): its cost model, from the shape alone."""
    cfg = PRESETS[shape]
    shapes = cfg.packed_linear_shapes() * cfg.num_layers
    return cost_model_folds(n, cfg.block_size, shapes, cfg.num_layers, SpecFoldSettings())


def table_from_per_check(rows: list[dict], shape: str, prefix: int = 512, latency: str = "ms") -> dict:
    """Latencies of one model shape and prefix: {"dense": {N: ms}, "dense_compiled": {N: ms},
    "specfold": {N: [(ratio, ms), ...]} for N > 1 (calls that folded), "specfold_n1": ms or None}.
    ``latency`` names the rows' field to read: ``ms`` (CUDA-graph replays) or ``launched_ms`` (plain
    calls each waited for, host dispatch included); rows without it are left out."""
    if latency not in LATENCIES:
        raise ValueError(f"latency: expected one of {LATENCIES}, got {latency!r}")
    table: dict = {"dense": {}, "dense_compiled": {}, "specfold": {}, "specfold_n1": None, "write": None,
                   "write_compiled": None}
    for r in rows:
        if r.get("model") != shape or r.get("prefix") != prefix or latency not in r:
            continue
        n, ms = r["n_branches"], r[latency]
        if r["mode"] in ("dense", "dense_compiled"):
            table[r["mode"]][n] = ms
        elif r["mode"] in ("write", "write_compiled"):
            table[r["mode"]] = ms
        elif r["mode"] == "specfold" and n == 1:
            table["specfold_n1"] = ms
        elif r["mode"] == "specfold" and r.get("folded", True):
            table["specfold"].setdefault(n, []).append((r["recompute_ratio"], ms))
    for points in table["specfold"].values():
        points.sort()
    return table


def _interp(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear through sorted (x, y) points, constant beyond the ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / max(x1 - x0, 1e-12)
    return points[-1][1]


def call_ms(table: dict, n: int, ratio: float, folded: bool, compiled: bool = False, shape: str | None = None) -> float:
    """Latency of one verification call with n branches: SpecFold at this recompute ratio if folded,
    else dense (under torch.compile's default backend if compiled). With ``shape``, a SpecFold call
    the backend would not fold there (a preset's name: its cost model) costs what it runs instead: the
    plain graph under Inductor (other names: every multi-branch call folds)."""
    if folded and shape in PRESETS and n > 1 and table["dense_compiled"] and not backend_folds(shape, n):
        compiled = True
    if compiled:
        return _interp(sorted(table["dense_compiled"].items()), n)
    dense = sorted(table["dense"].items())
    one = table["specfold_n1"] if folded and table.get("specfold_n1") is not None else table["dense"].get(1)
    if not folded or (n == 1 and one is None):
        return _interp(dense, n)
    if n == 1:
        return one
    # SpecFold at each measured N, at this ratio. At N = 1 there is nothing to fold; with ``shape``, the
    # calls reaching here fold, so only folded rows count (below the smallest measured N: its latency).
    per_n = [(1, one)] if one is not None and (shape not in PRESETS or not table["specfold"]) else []
    per_n += [(m, _interp(points, ratio)) for m, points in sorted(table["specfold"].items())]
    return _interp(per_n, n)


def _covers(measured: dict, calls: list) -> bool:
    """Whether measured Ns span every N of these calls (no extrapolation for a whole baseline)."""
    ns = [n for n, _ in calls]
    return bool(measured) and min(measured) <= min(ns) and max(measured) >= max(ns)


def write_ms(table: dict, compiled: bool) -> float:
    """One prefill / block write: measured write rows when the table has them, else dense eager N = 1."""
    if compiled and table.get("write_compiled") is not None:
        return table["write_compiled"]
    if table.get("write") is not None:
        return table["write"]
    return call_ms(table, 1, 1.0, folded=False)


def project(run_rows: list[dict], table: dict, shape: str, latency: str = "ms") -> list[dict]:
    """One projected row per measured (task, mode) row that carries its calls, plus ``spiffy_compiled``
    rows from the Spiffy run where no run measured it and the table's dense_compiled latencies cover the
    Spiffy run's branch counts. ``latency``: the field the table was read from (labels the rows: kind
    "projected" for CUDA-graph latencies, "projected, launched" for launched ones)."""
    kind = "projected" if latency == "ms" else "projected, launched"
    out = []
    measured = {(r["task"], r["mode"]) for r in run_rows if r.get("calls") and not r.get("kind", "").startswith("projected")}
    for r in run_rows:
        if r.get("kind", "").startswith("projected") or not r.get("calls"):
            continue
        if r["mode"] == "specfold" and (r["task"], "specfold_fold_all") in measured:
            continue  # projected from the fold_all run (its calls carry the ratios)
        mode = "specfold" if r["mode"] == "specfold_fold_all" else r["mode"]
        variants = [(mode, mode == "spiffy_compiled", bool(r.get("compile_writes")))]
        if r["mode"] == "spiffy" and (r["task"], "spiffy_compiled") not in measured:
            variants.append(("spiffy_compiled", True, True))
        for mode, compiled, compiled_writes in variants:
            if compiled and not _covers(table.get("dense_compiled", {}), r["calls"]):
                continue  # no extrapolation for a whole compiled baseline
            folded = mode == "specfold"
            other_ms = write_ms(table, compiled_writes)
            total = sum(call_ms(table, n, ratio, folded, compiled, shape) for n, ratio in r["calls"])
            total += (r["forwards"] - len(r["calls"])) * other_ms
            out.append({"task": r["task"], "mode": mode, "shape": shape, "kind": kind, "latency": latency,
                        "projected_tokens_per_s": r["tokens"] / (total / 1e3), "projected_ms": total,
                        "write_ms": other_ms, "compile_writes": compiled_writes,
                        "nfe": r["nfe"], "accuracy": r["accuracy"]})
    return out


def project_all(run_rows: list[dict], per_check: list[dict], prefix: int = 512, latency: str = "ms") -> list[dict]:
    """``project`` at every shape of SHAPES whose per_check rows have dense and SpecFold latencies."""
    out = []
    for shape in SHAPES:
        table = table_from_per_check(per_check, shape, prefix, latency)
        if table["dense"] and table["specfold"]:
            out += project(run_rows, table, shape, latency)
    return out


def with_specfold_from(rows: list[dict], run_rows: list[dict]) -> list[dict]:
    """``rows`` with the SpecFold rows of every (model, prefix, N) that ``run_rows`` measured replaced by
    the run's own SpecFold rows."""
    key = lambda r: (r.get("model"), r.get("prefix"), r.get("n_branches"))  # noqa: E731
    run_specfold = [r for r in run_rows if r.get("mode") == "specfold"]
    points = {key(r) for r in run_specfold}
    return [r for r in rows if not (r.get("mode") == "specfold" and key(r) in points)] + run_specfold


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("end_to_end")
    ap.add_argument("per_check")
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--latency", choices=LATENCIES, action="append", default=None,
                    help="per_check field to charge (repeatable; default: ms, and launched_ms too where the "
                         "table has it)")
    ap.add_argument("--specfold-from", action="append", default=[], metavar="RUN.json",
                    help="per_check run whose SpecFold rows replace PER_CHECK's at the same model, prefix and N")
    args = ap.parse_args(argv)
    check_output(ap, args.end_to_end, "end_to_end")  # rewritten in place at the end
    e2e = json.loads(Path(args.end_to_end).read_text())
    per_check = json.loads(Path(args.per_check).read_text())["rows"]
    for run in args.specfold_from:
        per_check = with_specfold_from(per_check, json.loads(Path(run).read_text())["rows"])
    measured = [r for r in e2e["rows"] if not r.get("kind", "").startswith("projected")]
    projected = []
    latencies = args.latency or [f for f in LATENCIES if f == "ms" or any(f in r for r in per_check)]
    for latency in latencies:
        projected += project_all(measured, per_check, args.prefix, latency)
    e2e["rows"] = measured + projected
    e2e["projected_from"] = {"per_check": args.per_check, "prefix": args.prefix}
    if args.specfold_from:
        e2e["projected_from"]["specfold_from"] = args.specfold_from
    Path(args.end_to_end).write_text(json.dumps(e2e, indent=1) + "\n")
    for r in projected:
        print(f"{r['shape']:18s} {r['task']:9s} {r['mode']:16s} {r['projected_tokens_per_s']:8.1f} tok/s ({r['kind']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
