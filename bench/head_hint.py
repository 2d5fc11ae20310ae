"""Can the host pick a call's cuBLAS head? Per verification call of the trained model's Spiffy decoding
(every multi-branch call folded, tau 0.1, CPU reference ops), the first layer's computed rows as the
host can count them from the drafts (the main block plus every draft position whose token differs from
its parent's) against each layer's computed rows as the gates decided.

    PYTHONPATH=. python -m bench.head_hint --limit 4 [--out OUT.json]

Prints one JSON summary: calls, calls where the host count differs from the first gate's (should be
0), and the deepest-layer-max over host-count ratios (min / median / p90 / max).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from bench.common import check_output
from bench.suites.end_to_end import CallRecorder


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=4, help="problems per task")
    ap.add_argument("--tasks", default=None, help="comma-separated subset of the task suite")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.out:
        check_output(ap, args.out)
    import specfold_compile  # noqa: F401  (registers the backend)
    from specfold_compile.decoding import generate
    from specfold_compile.loading import DEFAULT_MODEL_DIR, encode, load_model
    from specfold_compile.tasks import TASKS, sample

    model = load_model(None, device="cpu")
    compiled = torch.compile(model, backend="specfold",
                             options={"tau": 0.1, "kernels": "torch", "fold_min_branches": 2})
    calls = []  # (N, host count, [computed rows per layer])

    class Recorder(CallRecorder):  # the end_to_end suite's recorder (each call's fold stats), plus the host count
        def __call__(self, tokens, parents, cache, logit_positions=None):
            out = super().__call__(tokens, parents, cache, logit_positions)
            n, stats = self.calls[-1]
            if n > 1 and stats.layers:
                t, p = tokens.cpu(), parents.cpu()
                block = t.shape[1]
                host = block + int((t[1:] != t[p[1:]]).sum())
                calls.append((n, host, [block + s.computed_draft_rows for s in stats.layers]))
            return out

    graph = str(Path(DEFAULT_MODEL_DIR) / "draft_graph.json")
    tasks = args.tasks.split(",") if args.tasks else TASKS
    for task in tasks:
        for prob in sample(task, "test", args.limit, 0):
            generate(Recorder(compiled, model), encode(model, prob.prompt), mode="spiffy", max_new_tokens=96,
                     draft_budget=16, draft_graph=graph)
    growth = sorted(max(rows) / host for _, host, rows in calls)
    summary = {"calls": len(calls), "first_layer_differs": sum(rows[0] != host for _, host, rows in calls)}
    if growth:
        summary.update(max_over_host_min=round(growth[0], 2), median=round(statistics.median(growth), 2),
                       p90=round(growth[int(0.9 * len(growth))], 2), max=round(growth[-1], 2))
    print(json.dumps(summary))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "calls": calls}, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    main()
