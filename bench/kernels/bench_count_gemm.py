"""GEMMs over the first ``count`` rows of a packed batch, ``count`` on the device: the packed linears'
fixed cuBLAS head + count-aware spill (what the backend runs) against ``torch._grouped_mm`` with one
group whose end is ``count`` (CUTLASS on Hopper: row tiles past the count do no work, in one launch, each
weight read once), and against a Triton GEMM for few rows that follows the count (``fewrow_gemm.py``:
``triton_fewrow`` in row tiles of 256, ``triton_fewrow_64`` of 64), one decoder layer's packed linears
(qkv, gate_up, down), weights cold in L2.

    PYTHONPATH=. python bench/kernels/bench_count_gemm.py --models fast-dllm-v2-1.5b,fast-dllm-v2-7b,nld-3b \
        --out bench/kernels/results/bench_count_gemm_h100.json

(the committed run is an H100's; docs/design-notes.md reads it). ``mm_exact_rows`` (cuBLAS on exactly
``count`` rows, as if the host knew it) is the bound of any GEMM that follows the count.

Rows: {"model", "rows" (R = N * 32), "count", "variant", "us" (per layer, CUDA-graph replays), "err"
(relative error of the computed rows against fp32)}. Also probes whether this torch can capture CUDA-graph
conditional nodes (``torch.cuda.CUDAGraph.begin_capture_to_if_node``).

``--per-linear``: each linear of the layer timed alone (rows also carry ``"linear"``: qkv, gate_up or down),
to tell which weights a variant wins or loses on.

``--split-k``: instead, the head's GEMM (cuBLAS on 128, 256 or 512 rows; ``o`` on 256 and 544, every row as the
backend runs it) as ``splits`` GEMMs over equal slices of K in one strided batched call, partial sums in fp32 or
bf16, then summed (``split_k_mm``): whether more thread blocks for a narrow output beat one GEMM. Rows:
{"model", "linear", "rows", "variant" ("mm" or "splitkS_fp32" / "splitkS_bf16"), "us", "err"}.

``--spill-configs``: instead, the spill kernel alone (rows past the 256-row head of R = 544, each linear
apart) at every tile config of the autotuner's candidates (a superset of what it chooses from under the
device profile's ``packed_linear_min_block_r``), for counts from 256 (nothing spills: the launch of exiting programs) to
544, next to what the autotuner picked (tuned with a quarter of the spill rows computed). Rows:
{"model", "linear", "count", "config", "us", "err"}, and per linear the autotuner's picks so far
({key: config}) with the min_block_r it chose under.
"""
from __future__ import annotations

import json

import torch

from bench.kernels.bench_cublas_gemm import gpu_args, replay_median_ms, weight_shapes
from bench.kernels.fewrow_gemm import fewrow_gemm

from specfold_compile.models.config import preset

POINTS = {288: (32, 64, 128, 200), 544: (32, 100, 128, 160, 200, 256, 300, 400, 544), 1056: (100, 200, 300, 600)}


def layer_shapes(cfg) -> list[tuple[int, int]]:
    """(out, in) of the packed linears of one layer, fused as the models run them."""
    shapes = weight_shapes(cfg)
    return [shapes["qkv"], shapes["gate_up"], shapes["down"]]


def time_graph(fn, replays: int = 20) -> float:
    """Median ms of one replay of a CUDA graph of ``fn`` (after a warm-up call outside capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    return replay_median_ms(graph, replays)


def cold_copies(m: int, k: int, total_bytes: float) -> list[torch.Tensor]:
    """Random bf16 [m, k] weights (scaled by 1/sqrt(k)), enough copies (at least 2) that a pass over them reads
    more than ``total_bytes`` and so finds none in L2."""
    return [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
            for _ in range(max(2, int(total_bytes // (m * k * 2)) + 1))]


def timed_row(row: dict, fn, err, passes: int) -> dict:
    """``row`` with ``us`` (a CUDA-graph replay of ``fn`` over ``passes`` weight copies, per copy) and ``err``
    (``err()`` after it), or ``error`` where it fails (a config that does not fit, an op this torch lacks);
    printed as it comes."""
    try:
        ms = time_graph(fn)
        row.update(us=round(1e3 * ms / passes, 2), err=err())
    except Exception as exc:  # a probe: report and go on
        row["error"] = repr(exc)[:300]
    print(json.dumps(row), flush=True)
    return row


SPILL_COUNTS = (256, 300, 328, 400, 544)  # R = 544, head 256: nothing, 44, 72 (the tuning load), 144, 288 rows


def spill_configs(models) -> list[dict]:
    """The spill kernel per tile config and spill size, each linear of a layer apart (see the docstring)."""
    import importlib

    import triton

    from specfold_compile.backend.settings import Tuning

    pl = importlib.import_module("specfold_compile.kernels.packed_linear")  # the module, not the function
    min_block_r = Tuning().packed_linear_min_block_r  # the profile's, or $SPECFOLD_PACKED_LINEAR_MIN_BLOCK_R

    R, head, rows = 544, 256, []
    for name in models:
        for lname, (m, k) in zip(("qkv", "gate_up", "down"), layer_shapes(preset(name))):
            weights = cold_copies(m, k, 400e6)
            x = torch.randn(R, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(R, m, device="cuda", dtype=torch.bfloat16)
            count = torch.zeros((), device="cuda", dtype=torch.int64)
            configs = {"autotuned": None}
            configs.update({f"{c.kwargs['BLOCK_R']}x{c.kwargs['BLOCK_N']}x{c.kwargs['BLOCK_K']}w{c.num_warps}s{c.num_stages}": c
                            for c in pl._cuda_configs(16)})  # every candidate
            for c in SPILL_COUNTS:
                for cname, cfg in configs.items():
                    count.fill_(c)

                    def run(cfg=cfg):
                        for w in weights:
                            if cfg is None:
                                pl.packed_linear(x, w, None, count, min_block_r=min_block_r, row_start=head, out=y)
                                continue
                            meta = cfg.kwargs
                            grid = (triton.cdiv(R - head, meta["BLOCK_R"]), triton.cdiv(m, meta["BLOCK_N"]))
                            pl._packed_linear_body[grid](
                                x, w, y, y, count, R, m, k, pl._row_bucket(R - head), head, x.stride(0),
                                w.stride(0), y.stride(0), HAS_BIAS=False, HAS_COUNT=True, PREC="tf32",
                                EVEN_K=k % meta["BLOCK_K"] == 0, **meta, num_warps=cfg.num_warps,
                                num_stages=cfg.num_stages)

                    def err(c=c):
                        want = x[head:c].float() @ weights[-1].float().t()
                        return float((y[head:c].float() - want).norm() / want.norm()) if c > head else 0.0

                    rows.append(timed_row({"model": name, "linear": lname, "count": c, "config": cname}, run, err,
                                          len(weights)))
            if pl.use_autotune():
                picked = {str(k): str(v) for k, v in pl._tuned_kernel(min_block_r).cache.items()}
                rows.append({"model": name, "linear": lname, "min_block_r": min_block_r,
                             "autotuned_configs_so_far": picked})
            del weights
    return rows


def split_k_mm(x: torch.Tensor, w: torch.Tensor, splits: int, partials: torch.dtype) -> torch.Tensor:
    """x @ w^T as ``splits`` GEMMs over equal slices of K (one strided batched call, no copies), the partial
    sums kept in ``partials`` and added in fp32; returns x's dtype. K must divide into the splits."""
    rows, k = x.shape
    m = w.shape[0]
    xs = x.view(rows, splits, k // splits).transpose(0, 1)  # [S, rows, K/S], row stride K
    ws = w.view(m, splits, k // splits).permute(1, 2, 0)  # [S, K/S, m], the weight's own memory
    part = torch.bmm(xs, ws) if partials == x.dtype else torch.bmm(xs, ws, out_dtype=partials)
    return part.sum(0, dtype=torch.float32).to(x.dtype)


def split_k(models) -> list[dict]:
    """The head's GEMM whole against split over K (see the docstring), each linear alone, weights cold."""
    rows = []
    for name in models:
        shapes = weight_shapes(preset(name))
        for lname in ("down", "o", "qkv", "gate_up"):
            m, k = shapes[lname]
            weights = cold_copies(m, k, 600e6)
            for n_rows in ((256, 544) if lname == "o" else (128, 256, 512)):
                x = torch.randn(n_rows, k, device="cuda", dtype=torch.bfloat16)
                want = x.float() @ weights[-1].float().t()
                outs = {}
                variants = {"mm": lambda: [outs.__setitem__("y", torch.mm(x, w.t())) for w in weights]}
                for splits in (2, 3, 4, 5, 6, 8):
                    if k % splits or (k // splits) % 8:  # 16-byte aligned slices
                        continue
                    for pname, partials in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
                        variants[f"splitk{splits}_{pname}"] = lambda s=splits, p=partials: [
                            outs.__setitem__("y", split_k_mm(x, w, s, p)) for w in weights]
                for vname, fn in variants.items():
                    rows.append(timed_row({"model": name, "linear": lname, "rows": n_rows, "variant": vname}, fn,
                                          lambda: float((outs["y"].float() - want).norm() / want.norm()), len(weights)))
            del weights
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    args = gpu_args("bench_count_gemm", __doc__, flags=("--spill-configs", "--per-linear", "--split-k"))
    if args.spill_configs or args.split_k:
        rows = spill_configs(args.models) if args.spill_configs else split_k(args.models)
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
        return
    from specfold_compile.ops import fold_ops

    probe = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(),
             "conditional_nodes": hasattr(torch.cuda.CUDAGraph, "begin_capture_to_if_node"),
             "grouped_mm": hasattr(torch, "_grouped_mm")}
    print(json.dumps(probe), flush=True)
    rows = [probe]
    for name in args.models:
        shapes = layer_shapes(preset(name))
        # enough copies that the weights timed (a layer, or with --per-linear its smallest linear) miss L2
        timed_bytes = min(m * k * 2 for m, k in shapes) if args.per_linear else sum(m * k * 2 for m, k in shapes)
        copies = max(2, int(600e6 // timed_bytes) + 1)
        layers = [[torch.randn(m, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for m, k in shapes]
                  for _ in range(copies)]
        layers_kn = [[w.t().contiguous().unsqueeze(0) for w in ws] for ws in layers]
        for R, counts, only in [(R, c, i) for R, c in POINTS.items()
                                for i in ((0, 1, 2) if args.per_linear else (None,))]:
            picked = [i for i in range(len(shapes)) if only is None or i == only]  # the linears timed
            xs = [torch.randn(R, k, device="cuda", dtype=torch.bfloat16) for m, k in shapes]
            count = torch.zeros((), device="cuda", dtype=torch.int64)
            offs = torch.zeros(1, device="cuda", dtype=torch.int32)
            outs = {}

            def fixed_head():
                for ws in layers:
                    for i in picked:
                        outs[i] = fold_ops.packed_linear(xs[i], ws[i], None, count, 0.45, "triton", 2.0)

            def grouped(kn: bool, cast: bool):
                def run():
                    if cast:  # the backend's count is int64; _grouped_mm takes int32 group ends
                        offs.copy_(count.view(1))
                    for ws, wkn in zip(layers, layers_kn):
                        for i in picked:
                            outs[i] = torch._grouped_mm(xs[i], wkn[i] if kn else ws[i].t().unsqueeze(0), offs=offs)
                return run

            def fewrow(tile: int):
                def run():
                    for ws in layers:
                        for i in picked:
                            outs[i] = fewrow_gemm(xs[i], ws[i], None, count, tile=tile)
                return run

            def mm_rows(c):
                def run():
                    for ws in layers:
                        for i in picked:
                            outs[i] = torch.mm(xs[i][:c], ws[i].t())
                return run

            for c in counts:
                count.fill_(c)
                offs.fill_(c)
                variants = {"fixed_head_spill": fixed_head, "mm_exact_rows": mm_rows(c),
                            "grouped_mm": grouped(False, False), "grouped_mm_cast": grouped(False, True),
                            "grouped_mm_kn": grouped(True, False), "triton_fewrow": fewrow(256),
                            "triton_fewrow_64": fewrow(64)}

                def err(c=c):
                    errs = []
                    for i in picked:
                        want = xs[i][:c].float() @ layers[-1][i].float().t()
                        got = outs[i][:c].float()
                        errs.append(float((got - want).norm() / want.norm()) if torch.isfinite(got).all()
                                    else float("inf"))
                    return max(errs)

                for vname, fn in variants.items():
                    row = {"model": name, "rows": R, "count": c, "variant": vname,
                           **({} if only is None else {"linear": ("qkv", "gate_up", "down")[only]})}
                    rows.append(timed_row(row, fn, err, len(layers)))
        del layers, layers_kn
        torch.cuda.empty_cache()
    with open(args.out, "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
