"""Shared pieces of the GPU benchmarks: versions, CUDA-graph and launched timing, draft trees, floors."""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import torch

from specfold_compile.ops.device_profile import H200

# The H200's ceilings (device-to-device copy bytes/s; bf16 FLOP/s on random data), one definition shared
# with the backend's packed-linear cost estimate (the device profile).
COPY_BW, MATMUL_FLOPS = H200.gemm_bytes_per_s, H200.gemm_flops_per_s


def versions() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # pragma: no cover
        info["triton"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.split("\n")[0].strip()  # one line per GPU
        except Exception:
            info["driver"] = None
    return info


def out_dir(default: str = "bench/results") -> Path:
    """The results directory, ``$OUT`` or ``default``: created, and checked to accept new files
    (``UsageError`` naming OUT otherwise)."""
    from specfold_compile.cli.arguments import output_dir  # noqa: PLC0415

    return output_dir(os.environ.get("OUT") or default, "OUT")


def check_output(parser, path: str, flag: str = "--out") -> None:
    """Before any measurement: ``path`` can be written (its directory exists or is created), else the
    parser's one-line error (status 2)."""
    from specfold_compile.cli.arguments import UsageError, output_file  # noqa: PLC0415

    try:
        output_file(path, flag)
    except UsageError as e:
        parser.error(str(e))


def freeze_collector() -> None:
    """``--freeze-gc``, after a warm-up: every object alive now (compiled and captured graphs, the models)
    moved out of the garbage collector's sight (``gc.freeze``), as a serving process does once it is warm,
    so that a timed decode's collections walk only what it allocates (a full collection after the
    compiles walks several hundred thousand objects). ``gc.unfreeze()`` undoes it."""
    gc.collect()
    gc.freeze()


def write_json(path: Path, rows: list[dict], extra: dict | None = None) -> None:
    path.write_text(json.dumps({"versions": versions(), **(extra or {}), "rows": rows}, indent=1) + "\n")


def time_cuda_graph(fn: Callable[[], Any], replays: int = 30, warmup: int = 3) -> tuple[float, bool]:
    """Median ms of CUDA-graph replays of ``fn`` (captured after warm-up). Falls back to plain calls
    (returning cuda_graph=False) if capture fails; on the CPU, plain calls timed with perf_counter."""
    if not torch.cuda.is_available():
        return time_launched(fn, replays, warmup), False
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run, captured = graph.replay, True
    except Exception:
        torch.cuda.synchronize()
        run, captured = fn, False
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), captured


def time_launched(fn: Callable[[], Any], calls: int = 10, warmup: int = 2) -> float:
    """Median wall-clock ms of plain calls of ``fn``, each waited for (``torch.cuda.synchronize``): what a
    decode loop without CUDA graphs pays per verification call, which reads the call's logits before it
    builds the next one. Host dispatch (guards, Python, kernel launches) counts here, while
    ``time_cuda_graph`` replays the captured kernels only."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def draft_tree(n_rows: int) -> list[int]:
    """A Spiffy-like shallow draft graph: a few level-1 drafts of the main row, the rest their children."""
    parents = [-1]
    level1 = max(1, min(4, n_rows - 1))
    for n in range(1, n_rows):
        parents.append(0 if n <= level1 else 1 + (n - level1 - 1) % level1)
    return parents


def draft_tokens(main: torch.Tensor, parents: list[int], changed: int, vocab: int, gen: torch.Generator
                 ) -> torch.Tensor:
    """Rows equal to their parent except at ``changed`` random positions (one decoding step's commits)."""
    rows = [main]
    block = main.shape[0]
    for n in range(1, len(parents)):
        row = rows[parents[n]].clone()
        pos = torch.randperm(block, generator=gen)[:changed]
        row[pos] = torch.randint(0, vocab, (changed,), generator=gen)
        rows.append(row)
    return torch.stack(rows)


def floor_ms(cfg, n_rows: int, computed_rows: int, prefix: int, logit_rows: int | None = None) -> float:
    """Weights read once vs the FLOPs of the recomputed rows (projections + MLP) plus every row's
    attention and the LM head on ``logit_rows`` rows (default: every row): the larger of the two times."""
    c, hd, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    layer_params = c * hd * (cfg.num_heads + 2 * cfg.num_kv_heads) + cfg.num_heads * hd * c + 3 * c * f
    weight_bytes = 2 * (cfg.num_layers * layer_params + cfg.vocab_size * c * (1 if cfg.tie_word_embeddings else 2))
    block = cfg.block_size
    rows = n_rows * block
    attn_flops = 4 * cfg.num_heads * hd * (computed_rows * prefix + rows * block)
    proj_flops = 2 * (c * hd * (cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * c * f) * computed_rows \
        + 2 * cfg.num_heads * hd * c * rows
    head_rows = rows if logit_rows is None else logit_rows
    flops = cfg.num_layers * (attn_flops + proj_flops) + 2 * c * cfg.vocab_size * head_rows
    return 1e3 * max(weight_bytes / COPY_BW, flops / MATMUL_FLOPS)


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def write_profile(run, path: Path, cuda: bool) -> None:
    """``run()`` under ``torch.profiler``, its operators' tables (sorted by device time, then by host time)
    written to ``path``: where a run's time goes."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        run()
    path.parent.mkdir(parents=True, exist_ok=True)
    averages = prof.key_averages()
    path.write_text("\n\n".join(averages.table(sort_by=key, row_limit=40) for key in
                                 (("self_cuda_time_total",) if cuda else ()) + ("self_cpu_time_total",)))
    print(f"profile: {path}", flush=True)
