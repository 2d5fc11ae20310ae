"""Plot per-check latency against the number of branches (like the SpecFold paper's Fig. 3).

``python -m bench.plot bench/results/h200/per_check.json`` writes ``per_check.png`` next to it;
``python -m bench.plot OUT.json IN1.json IN2.json ...`` first merges the rows of several runs (e.g. one
device call per model) into OUT.json; a later run's row replaces an earlier row of the same point
(model, prefix, N, mode, target ratio). An existing OUT.json is merged first, so its other points stay
(delete it to start over). One per_check JSON holds one configuration of options: ablations (another
``--dense-fraction``, say) go to files of their own.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def plot_per_check(path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    rows = [r for r in json.loads(path.read_text())["rows"] if r.get("mode") != "error"]
    models = sorted({r["model"] for r in rows})
    prefixes = sorted({r["prefix"] for r in rows})
    fig, axes = plt.subplots(len(prefixes), len(models), figsize=(5.5 * len(models), 4.2 * len(prefixes)),
                             squeeze=False)
    for ax, (prefix, model) in zip(axes.flat, [(p, m) for p in prefixes for m in models]):
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for r in rows:
            if (r["model"], r["prefix"]) != (model, prefix):
                continue
            if r["mode"] in ("dense", "dense_compiled"):
                label = r["mode"]
            elif r["mode"] in ("specfold", "specfold_no_inductor", "specfold_graph_flags"):
                if r.get("target_ratio") is None:  # N = 1: nothing folded, not a point of a ratio series
                    continue
                label = f"{r['mode']} (ratio ~{r['target_ratio']})"
            elif r["mode"] == "floor" and r.get("target_ratio") is None:
                label = "floor (dense)"
            else:
                continue
            series[label].append((r["n_branches"], r["ms"]))
        for label, points in sorted(series.items()):
            xs, ys = zip(*sorted(points))
            ax.plot(xs, ys, marker="o", linestyle="--" if "floor" in label else "-", label=label)
        ax.set_title(f"{model}, prefix {prefix}")
        ax.set_xlabel("branches N")
        ax.set_ylabel("ms per verification forward")
        ax.legend(fontsize=7)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=120)
    return out


def _point(row: dict) -> tuple:
    """What a per_check row measured (a re-measurement of the same point replaces it)."""
    return tuple(row.get(k) for k in ("model", "prefix", "n_branches", "mode", "target_ratio", "what"))


def merge_results(out: str | Path, inputs: list[str | Path]) -> Path:
    """One JSON from several runs of the same suite: rows in input order, a later run's row replacing an
    earlier one of the same point; every run's header kept (a merged input's own run list is kept)."""
    runs = [json.loads(Path(p).read_text()) for p in inputs]
    rows: dict[tuple, dict] = {}
    for run in runs:
        for row in run["rows"]:
            rows.pop(_point(row), None)  # re-insert: the newest measurement, in its run's order
            rows[_point(row)] = row
    headers = []
    for run in runs:
        headers += run.get("runs") or [{k: v for k, v in run.items() if k != "rows"}]
    merged = {"versions": runs[0].get("versions"), "suite": runs[0].get("suite"), "runs": headers,
              "rows": list(rows.values())}
    Path(out).write_text(json.dumps(merged, indent=1) + "\n")
    return Path(out)


def main(argv: list[str]) -> Path:
    """``OUT [IN ...]``: merge the inputs into OUT (after what OUT already holds), then plot OUT."""
    out = Path(argv[0] if argv else "bench/results/per_check.json")
    inputs = argv[1:]
    if inputs:
        if out.is_file() and not any(Path(p).resolve() == out.resolve() for p in inputs):
            inputs = [str(out), *inputs]  # keep what OUT already holds
        merge_results(out, inputs)
    return plot_per_check(out)


if __name__ == "__main__":
    print(main(sys.argv[1:]))
