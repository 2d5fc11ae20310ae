"""Plots of bench/run.py's suites, each a PNG next to its JSON (``path.with_suffix(".png")``):
  per_check   latency of one verification forward against the number of branches (like the SpecFold
              paper's Fig. 3);
  breakdown   kernel ms per forward of each mode, stacked by part of the forward;
  memory      memory one verification forward adds, dense and SpecFold, against a per-branch copy of the
              prefix cache;
  end_to_end  tokens/s per task and mode: measured on the trained tiny model, and projected to the real
              shapes (one panel per shape and latency);
  batched     the serving engine's throughput against concurrency, a line per mode, one panel per model
              (bench/batched.py).

``python -m bench.plot RESULT.json`` plots any of these (by the JSON's "suite"), writing RESULT.png;
``python -m bench.plot OUT.json IN1.json IN2.json ...`` first merges the rows of several runs of one
suite (e.g. one run per model) into OUT.json; a later run's row replaces an earlier row of the
same point (model, prefix, N, mode, target ratio; a breakdown row's part too). An existing OUT.json is
merged first, so its other points stay (delete it to start over). One JSON holds one configuration of
options: ablations (another ``--dense-fraction``, say) go to files of their own.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

MB = 1e6
# What a projected row's latency field says the projection charged (bench/project.py LATENCIES).
LATENCY_WORDS = {"ms": "CUDA-graph calls", "launched_ms": "launched calls"}


def draft_budget(row: dict) -> int:
    """The draft budget a row's record decoded with (a row without the field, or 0: the default)."""
    from specfold_compile.decoding import DEFAULTS  # noqa: PLC0415

    return row.get("draft_budget") or DEFAULTS.draft_budget


def drafts_bound(row: dict) -> int | None:
    """A row's drafts a call when its record used another budget than the default (``bench.batched record
    --draft-budget``, ``bench.trace_driven record --draft-budget``), else None."""
    from specfold_compile.decoding import DEFAULTS  # noqa: PLC0415

    budget = draft_budget(row)
    return None if budget == DEFAULTS.draft_budget else budget


def serving_series(row: dict) -> str:
    """A batched row's series: its mode, with ``+ragged`` when the engine attended through the ragged
    kernel (``attention="ragged"``; the plain mode name is per-request attention), ``+graphs``, SpecFold's
    packing capacity other than the default, a bound on the drafts a call and on the rows a forward
    (``Engine(max_verify_rows=)``), SpecFold's replayed gates by tensor ops (``BatchGraphs(gate_kernel=False)``),
    its attention over the packed rows (``BatchGraphs(packed_attention=True)``),
    every row built after a block write's seeds are read (the engine's ``rows_ahead`` off), and the engine's
    device loop (``Engine(loop="device")``)."""
    return row["mode"] + ("+ragged" if row.get("attention") == "ragged" else "") + (
        "+graphs" if row.get("cuda_graphs") else "") + (
        f"+capacity {row['fold_capacity']}" if row.get("fold_capacity") not in (None, "0.5") else "") + (
        f"+drafts {drafts_bound(row)}" if drafts_bound(row) is not None else "") + (
        f"+rows {row['max_verify_rows']}" if row.get("max_verify_rows") is not None else "") + (
        "+tensor-op gates" if row.get("gate_kernel") is False else "") + (
        "+packed attention" if row.get("packed_attention") else "") + (
        "+no rows ahead" if row.get("rows_ahead") is False else "") + (
        f"+{loop_label(row)}" if loop_label(row) else "")


def loop_label(row: dict) -> str | None:
    """A row's engine loop other than the host loop: "device loop", with ", eager step" where its
    bookkeeping was not compiled (``Engine(compile_step=False)``; a row without ``compile_step`` predates
    the choice)."""
    if row.get("loop") in (None, "host"):
        return None
    return "device loop" + (", eager step" if row.get("compile_step") is False else "")


def _rows(path: Path) -> list[dict]:
    return json.loads(path.read_text())["rows"]


def _in_order(values) -> list:
    """Distinct values in the order they first appear (the order the suite measured them)."""
    return list(dict.fromkeys(values))


def _subplots(n_panels: int, ncols: int, width: float, height: float):
    """A figure of n_panels axes (width x height inches each), ncols to a row, unused cells hidden.
    Matplotlib is imported here so that importing this module (bench.run does) costs nothing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = max(1, min(ncols, n_panels))
    nrows = max(1, math.ceil(n_panels / ncols))
    # constrained layout keeps a figure legend placed "outside" clear of the panels
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[n_panels:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n_panels])


def _colours(names: list[str]) -> dict[str, tuple]:
    """One colour per name, the same in every panel of a figure."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def _figure_legend(fig, colours: dict[str, tuple]) -> None:
    """One legend for the whole figure, right of the panels (where it covers no bar, at any width)."""
    from matplotlib.patches import Patch

    handles = [Patch(color=colour, label=name) for name, colour in colours.items()]
    fig.legend(handles=handles, loc="outside right upper", fontsize=8)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    out = path.with_suffix(".png")
    fig.savefig(out, dpi=120)
    plt.close(fig)  # bench.run plots several suites in one process
    return out


def plot_per_check(path: str | Path) -> Path:
    path = Path(path)
    rows = [r for r in _rows(path) if r.get("mode") != "error"]
    models = sorted({r["model"] for r in rows})
    prefixes = sorted({r["prefix"] for r in rows})
    fig, axes = _subplots(len(prefixes) * len(models), len(models), 5.5, 4.2)
    for ax, (prefix, model) in zip(axes, [(p, m) for p in prefixes for m in models]):
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
    return _save(fig, path)


def plot_breakdown(path: str | Path) -> Path:
    """One panel per (model, N): a bar per mode, its kernel ms per forward stacked by part. The parts
    of a mode add up to its whole forward (share sums to 1), so the bar's length is the total."""
    path = Path(path)
    rows = _rows(path)
    ms = {(r["model"], r["n_branches"], r["mode"], r["part"]): r["ms_per_forward"] for r in rows}
    # the parts that take longest overall first, at the base of every bar, where they are easiest to compare
    parts = sorted(_in_order(r["part"] for r in rows),
                   key=lambda part: -sum(v for k, v in ms.items() if k[3] == part))
    colours = _colours(parts)
    panels = _in_order((r["model"], r["n_branches"]) for r in rows)
    most_modes = max(len({r["mode"] for r in rows if (r["model"], r["n_branches"]) == p}) for p in panels)
    fig, axes = _subplots(len(panels), 2, 6.5, 1.4 + 0.7 * most_modes)
    for ax, (model, n) in zip(axes, panels):
        panel = [r for r in rows if (r["model"], r["n_branches"]) == (model, n)]
        modes = _in_order(r["mode"] for r in panel)
        ratio = {r["mode"]: r["recompute_ratio"] for r in panel}
        left = [0.0] * len(modes)
        for part in parts:
            widths = [ms.get((model, n, mode, part), 0.0) for mode in modes]
            ax.barh(range(len(modes)), widths, left=left, color=colours[part])
            left = [a + b for a, b in zip(left, widths)]
        for y, total in enumerate(left):
            ax.text(total, y, f" {total:.2f} ms", va="center", fontsize=8)
        ax.set_yticks(range(len(modes)), [f"{mode}\nrecompute {ratio[mode]:.2f}" for mode in modes], fontsize=8)
        ax.invert_yaxis()  # modes top to bottom in the order measured
        ax.set_xlim(0, 1.2 * max(left))  # room for the totals' labels
        ax.set_title(f"{model}, N = {n}")
        ax.set_xlabel("kernel ms per forward")
    _figure_legend(fig, colours)
    return _save(fig, path)


def plot_memory(path: str | Path) -> Path:
    """One panel per (model, prefix): the memory a forward adds over what was allocated before it, per
    mode against N, and what copying the prefix cache once per branch would take."""
    path = Path(path)
    rows = _rows(path)
    panels = _in_order((r["model"], r["prefix"]) for r in rows)
    fig, axes = _subplots(len(panels), 3, 5.5, 4.2)
    # dense and SpecFold nearly coincide: markers and line styles tell them apart
    styles = [("o", "-"), ("x", ":"), ("s", "-."), ("^", "--")]

    def line(ax, points: dict[int, float], **style) -> None:
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], **style)

    for ax, (model, prefix) in zip(axes, panels):
        panel = [r for r in rows if (r["model"], r["prefix"]) == (model, prefix)]
        for (marker, linestyle), mode in zip(itertools.cycle(styles), _in_order(r["mode"] for r in panel)):
            line(ax, {r["n_branches"]: r["extra_bytes"] / MB for r in panel if r["mode"] == mode},
                 marker=marker, linestyle=linestyle, label=mode)
        line(ax, {r["n_branches"]: r["per_branch_cache_copy_bytes"] / MB for r in panel}, color="grey",
             linestyle="--", label="a per-branch copy of the prefix cache")
        ax.set_yscale("log")
        ax.set_xticks(sorted({r["n_branches"] for r in panel}))  # the measured Ns
        ax.set_title(f"{model}, prefix {prefix}")
        ax.set_xlabel("branches N")
        ax.set_ylabel("MB one forward adds (peak - before)")
        ax.legend(fontsize=7, loc="upper left")
    return _save(fig, path)


def end_to_end_panels(rows: list[dict]) -> list[tuple[str, list[tuple[str, str, float]]]]:
    """The end_to_end plot's panels in row order, each (title, [(task, mode, tokens/s), ...]): one per
    kind of number, the measured run (its ``kind`` names the model and GPU) and each projection (model
    shape and latency charged; bench/project.py)."""
    panels: dict[str, list] = {}
    for r in rows:
        if "projected_tokens_per_s" in r:
            # rows from before launched projections have no latency field: they charged CUDA-graph calls
            title = f"projected to {r['shape']}\n({LATENCY_WORDS[r.get('latency', 'ms')]})"
            value = r["projected_tokens_per_s"]
        elif "tokens_per_s" in r:
            title = r.get("kind") or (f"{r['model']}, trace-driven" if r.get("trace_driven") else f"{r['model']}, measured")
            if r.get("fuse_boundaries"):
                fused = "block writes" if r["fuse_boundaries"] == "writes" else "block boundaries"
                title += f",\nfused {fused}"
            value = r["tokens_per_s"]
        else:
            continue
        panels.setdefault(title, []).append((r["task"], r["mode"], value))
    return list(panels.items())


def plot_draft_budgets(path: Path, rows: list[dict]) -> Path:
    """Tokens/s against the draft budget: one panel per model and task, a line per mode (each mode one
    colour in every panel)."""
    panels = _in_order((r["model"], r["task"]) for r in rows)
    colours = _colours(_in_order(r["mode"] for r in rows))
    fig, axes = _subplots(len(panels), 3, 4.5, 3.6)
    for ax, (model, task) in zip(axes, panels):
        for mode, colour in colours.items():
            points = sorted((draft_budget(r), r["tokens_per_s"]) for r in rows
                            if (r["model"], r["task"], r["mode"]) == (model, task, mode))
            if points:
                ax.plot(*zip(*points), marker="o", color=colour)
        ticks = sorted({draft_budget(r) for r in rows if (r["model"], r["task"]) == (model, task)})
        ax.set_xticks(ticks, [str(b) for b in ticks])
        ax.set_title(f"{model}, {task}" + (", trace-driven" if rows[0].get("trace_driven") else ""), fontsize=10)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("draft budget")
        ax.set_ylabel("tokens/s")
    _figure_legend(fig, colours)
    return _save(fig, path)


def plot_end_to_end(path: str | Path) -> Path:
    """Grouped bars of tokens/s: one panel per kind of number (end_to_end_panels), a group per task, a
    bar per mode (each mode one colour in every panel). Measured rows at several draft budgets: tokens/s
    against the budget instead (``plot_draft_budgets``)."""
    path = Path(path)
    rows = _rows(path)
    measured = [r for r in rows if "tokens_per_s" in r]
    if len({draft_budget(r) for r in measured}) > 1:
        return plot_draft_budgets(path, measured)
    panels = end_to_end_panels(rows)
    colours = _colours(_in_order(mode for _, bars in panels for _, mode, _ in bars))
    fig, axes = _subplots(len(panels), 3, 5.5, 4.0)
    for ax, (title, bars) in zip(axes, panels):
        tasks = _in_order(task for task, _, _ in bars)
        modes = _in_order(mode for _, mode, _ in bars)
        width = 0.8 / len(modes)
        for task, mode, value in bars:
            x = tasks.index(task) - 0.4 + width * (modes.index(mode) + 0.5)
            ax.bar(x, value, width, color=colours[mode])
        ax.set_xticks(range(len(tasks)), tasks)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("projected tokens/s" if title.startswith("projected") else "tokens/s")
    _figure_legend(fig, colours)
    return _save(fig, path)


def plot_batched(path: str | Path) -> Path:
    """Throughput (generated tokens/s over all requests) against concurrency: one panel per model, a line
    per mode (each mode one colour in every panel), concurrency on a log2 axis."""
    path = Path(path)
    rows = _rows(path)
    models = _in_order(r["model"] for r in rows)
    colours = _colours(_in_order(serving_series(r) for r in rows))
    fig, axes = _subplots(len(models), 3, 5.0, 3.8)
    for ax, model in zip(axes, models):
        for series, colour in colours.items():
            points = sorted((r["concurrency"], r["tokens_per_s"]) for r in rows
                            if (r["model"], serving_series(r)) == (model, series))
            if points:
                ax.plot(*zip(*points), marker="o", color=colour)
        ax.set_xscale("log", base=2)
        ticks = sorted({r["concurrency"] for r in rows if r["model"] == model})
        ax.set_xticks(ticks, [str(c) for c in ticks])
        ax.set_title(f"{model}, trace-driven" if all(r.get("trace_driven") for r in rows) else model, fontsize=10)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("generated tokens/s (all requests)")
    _figure_legend(fig, colours)
    return _save(fig, path)


PLOTS = {"per_check": plot_per_check, "breakdown": plot_breakdown, "memory": plot_memory,
         "end_to_end": plot_end_to_end, "batched": plot_batched}


def plot_results(path: str | Path) -> Path:
    """The plot of a bench.run JSON, by its "suite"."""
    suite = json.loads(Path(path).read_text()).get("suite")
    if suite not in PLOTS:
        raise ValueError(f"{path}: no plot for suite {suite!r}; plotted suites: {', '.join(PLOTS)}")
    return PLOTS[suite](path)


def _point(row: dict) -> tuple:
    """What a row measured (a re-measurement of the same point replaces it): a per_check point, one part
    of a breakdown row set (``part``, absent from per_check rows), an end-to-end row (``task``; its loop
    with or without fused block boundaries; ``repeat``: one of several runs of the same point, kept side by
    side) or a batched one (``concurrency``, ``arrival``, ``attention``,
    its graphs, capacity, bounds on drafts and rows, its loop, ``loop_label``, whether its rows were
    built after each block write (a row without ``rows_ahead`` had them built ahead where they could be)
    whether its gates took the tensor ops by choice, ``gate_kernel`` False, and whether its attention read
    the packed rows, ``packed_attention``)."""
    return tuple(row.get(k) for k in ("model", "prefix", "n_branches", "mode", "target_ratio", "what", "part", "task",
                                      "trace_driven", "fuse_boundaries", "concurrency", "arrival", "attention",
                                      "cuda_graphs", "fold_capacity", "max_verify_rows", "repeat")) + (
        drafts_bound(row), loop_label(row), row.get("rows_ahead") is False, row.get("gate_kernel") is False,
        bool(row.get("packed_attention")))


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
    """``OUT [IN ...]``: merge the inputs into OUT (after what OUT already holds), then plot OUT
    (any plotted suite; the merged file takes the first input's suite)."""
    from specfold_compile.cli.arguments import output_file, require_module  # noqa: PLC0415

    out = Path(argv[0] if argv else "bench/results/per_check.json")
    require_module("matplotlib", "bench.plot", "plot")  # before any merge is written
    output_file(out.with_suffix(".png"), "OUT")
    inputs = argv[1:]
    if inputs:
        if out.is_file() and not any(Path(p).resolve() == out.resolve() for p in inputs):
            inputs = [str(out), *inputs]  # keep what OUT already holds
        merge_results(out, inputs)
    return plot_results(out)


if __name__ == "__main__":
    from specfold_compile.cli.arguments import UsageError, fail

    try:
        print(main(sys.argv[1:]))
    except UsageError as e:
        fail("bench.plot", str(e))
