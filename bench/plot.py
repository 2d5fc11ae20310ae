"""Plot per-check latency against the number of branches (like the SpecFold paper's Fig. 3).

``python -m bench.plot bench/results/h200/per_check.json`` writes ``per_check.png`` next to it.
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
    panels = sorted({(r["model"], r["prefix"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (model, prefix) in zip(axes[0], panels):
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for r in rows:
            if (r["model"], r["prefix"]) != (model, prefix):
                continue
            if r["mode"] in ("dense", "dense_compiled"):
                label = r["mode"]
            elif r["mode"] in ("specfold", "specfold_inductor"):
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


if __name__ == "__main__":
    print(plot_per_check(sys.argv[1] if len(sys.argv) > 1 else "bench/results/per_check.json"))
