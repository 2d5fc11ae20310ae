"""Projected tokens/s: replay decoding runs' verification calls through per-check latencies.

The trained model is tiny and launch-bound, so its own tokens/s says little about a real model. Each
end_to_end run records every verification call it made (branch count N, measured recompute ratio);
this module sums, per run, the latency of each call at a real shape, read from per_check rows measured
on the GPU (dense for vanilla/Spiffy and N = 1, SpecFold interpolated in the recompute ratio, and in N
between measured branch counts), plus one dense N = 1 forward for every other forward (prefill, block
writes). The result is labelled "projected" everywhere it appears.

``python -m bench.project END_TO_END.json PER_CHECK.json`` replaces the projected rows of END_TO_END.json
with ones computed from PER_CHECK.json (prefix 512) and prints them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SHAPES = ("fast-dllm-v2-1.5b", "fast-dllm-v2-7b")


def table_from_per_check(rows: list[dict], shape: str, prefix: int = 512) -> dict:
    """{"dense": {N: ms}, "specfold": {N: [(ratio, ms), ...]}} of one model shape and prefix."""
    table: dict = {"dense": {}, "specfold": {}}
    for r in rows:
        if r.get("model") != shape or r.get("prefix") != prefix or "ms" not in r:
            continue
        if r["mode"] == "dense":
            table["dense"][r["n_branches"]] = r["ms"]
        elif r["mode"] == "specfold":
            table["specfold"].setdefault(r["n_branches"], []).append((r["recompute_ratio"], r["ms"]))
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


def call_ms(table: dict, n: int, ratio: float, folded: bool) -> float:
    """Latency of one verification call with n branches (SpecFold at this recompute ratio if folded)."""
    dense = sorted(table["dense"].items())
    if not folded or n == 1:
        return _interp(dense, n)
    # SpecFold at each measured N, at this ratio; at N = 1 it is the dense forward (nothing to fold).
    per_n = [(1, table["dense"][1])] if 1 in table["dense"] else []
    per_n += [(m, _interp(points, ratio)) for m, points in sorted(table["specfold"].items())]
    return _interp(per_n, n)


def project(run_rows: list[dict], table: dict, shape: str) -> list[dict]:
    """One projected row per measured (task, mode) row that carries its calls."""
    out = []
    for r in run_rows:
        if r.get("kind", "").startswith("projected") or not r.get("calls"):
            continue
        folded = r["mode"] == "specfold"
        total = sum(call_ms(table, n, ratio, folded) for n, ratio in r["calls"])
        total += (r["forwards"] - len(r["calls"])) * call_ms(table, 1, 1.0, False)
        out.append({"task": r["task"], "mode": r["mode"], "shape": shape, "kind": "projected",
                    "projected_tokens_per_s": r["tokens"] / (total / 1e3), "projected_ms": total,
                    "nfe": r["nfe"], "accuracy": r["accuracy"]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("end_to_end")
    ap.add_argument("per_check")
    ap.add_argument("--prefix", type=int, default=512)
    args = ap.parse_args(argv)
    e2e = json.loads(Path(args.end_to_end).read_text())
    per_check = json.loads(Path(args.per_check).read_text())["rows"]
    measured = [r for r in e2e["rows"] if r.get("kind") != "projected"]
    projected = []
    for shape in SHAPES:
        table = table_from_per_check(per_check, shape, args.prefix)
        if table["dense"] and table["specfold"]:
            projected += project(measured, table, shape)
    e2e["rows"] = measured + projected
    e2e["projected_from"] = {"per_check": args.per_check, "prefix": args.prefix}
    Path(args.end_to_end).write_text(json.dumps(e2e, indent=1) + "\n")
    for r in projected:
        print(f"{r['shape']:18s} {r['task']:9s} {r['mode']:8s} {r['projected_tokens_per_s']:8.1f} tok/s (projected)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
