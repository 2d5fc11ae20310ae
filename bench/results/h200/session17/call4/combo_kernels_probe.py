"""Session 17, device call 4: options["combo_kernels"] on the folded forward at the 1.5B shape.

Prefix 512, N = 17, 6 of 32 positions changed per draft (r ~ 0.19 at tau = 0.3, the per-check table's
column), every call folded (fold_min_branches=2, fold_launched=True): the same inputs through SpecFold
with and without Inductor's combo kernels; CUDA-graph medians in the order A B A B (the GPU drifts), the
first call's seconds (compiles), and the logits against each other and against the eager dense model.
Run from the repository root: PYTHONPATH=. python bench/results/h200/session17/call4/combo_kernels_probe.py OUT.json
"""

import json
import sys
import time

import torch

from bench import run as bench_run
from bench.common import time_cuda_graph, versions
from specfold_compile.backend import collect_stats, specfold_backend

torch._dynamo.config.recompile_limit = 64
model = bench_run._model(None, "fast-dllm-v2-1.5b")
cache = bench_run._prefix(model, 512, 1)
tokens, parents = bench_run._inputs(model, 17, 6, 2)
report = {"versions": versions(), "rows": []}
with torch.no_grad():
    dense = model(tokens, parents, cache)
    compiled, logits = {}, {}
    for combo in (False, True):
        options = {"tau": bench_run.TAU, "fold_min_branches": 2, "fold_launched": True, "combo_kernels": combo}
        compiled[combo] = torch.compile(model, backend=specfold_backend, options=options)
        t0 = time.monotonic()
        with collect_stats() as stats:
            logits[combo] = compiled[combo](tokens, parents, cache)
        torch.cuda.synchronize()
        report["rows"].append({"combo_kernels": combo, "first_call_s": time.monotonic() - t0,
                               "recompute_ratio": stats.recompute_ratio,
                               "logits_vs_dense": bench_run._rel(logits[combo], dense)})
    report["combo_vs_plain_logits"] = bench_run._rel(logits[True], logits[False])
    for combo in (False, True, False, True):
        ms, graph = time_cuda_graph(lambda: compiled[combo](tokens, parents, cache))
        report["rows"].append({"combo_kernels": combo, "ms": ms, "cuda_graph": graph})
        print(json.dumps(report["rows"][-1]), flush=True)
print(json.dumps(report, indent=1))
with open(sys.argv[1], "w") as f:
    json.dump(report, f, indent=1)
