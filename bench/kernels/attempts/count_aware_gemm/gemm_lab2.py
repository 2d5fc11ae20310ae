# Session 9 attempt, reverted (see README.md here).
"""GPU lab 2: TMA-descriptor count-aware GEMM vs cuBLAS on exactly `count` rows."""
import json, os, sys, time
import torch
sys.path.insert(0, os.path.dirname(__file__))
from stream_linear import tma_linear
from bench.kernels.bench_cublas_gemm import cold_weights, time_pass
SHAPES = {"1.5b_qkv": (2048, 1536), "1.5b_gate_up": (17920, 1536), "1.5b_down": (1536, 8960),
          "7b_qkv": (4608, 3584), "7b_gate_up": (37888, 3584), "7b_down": (3584, 18944)}
R = 544
COUNTS = [64, 129, 176, 256, 336]
OUT = os.environ.get("OUT", ".")
CFGS = [(64, 128, 64, 4, 4), (64, 128, 128, 4, 3), (128, 128, 64, 8, 4), (128, 128, 128, 8, 3), (64, 256, 64, 8, 3),
        (128, 256, 64, 8, 3), (64, 64, 128, 4, 4), (128, 64, 128, 8, 4), (64, 128, 64, 4, 6), (128, 128, 64, 8, 5)]
rows = []
t0 = time.time()
for name, (M, K) in SHAPES.items():
    ws = cold_weights(M, K)
    x = torch.randn(R, K, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(R, M, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ ws[0].float().t()
    count = torch.tensor(R, device="cuda")
    for c in COUNTS:
        xs, ys = x[:c], y[:c]
        def one():
            for w in ws:
                torch.mm(xs, w.t(), out=ys)
        rows.append({"shape": name, "count": c, "impl": "cublas_exact", "us": round(time_pass(one, len(ws)), 2)})
        print(json.dumps(rows[-1]), flush=True)
    for BR, BN, BK, nw, ns in CFGS:
        cfg = dict(BLOCK_R=BR, BLOCK_N=BN, BLOCK_K=BK, num_warps=nw, num_stages=ns)
        try:
            for c in COUNTS:
                count.fill_(c)
                y.zero_()
                tma_linear(x, ws[0], None, count, y, 0, **cfg)
                err = ((y[:c].float() - ref[:c]).abs().max() / ref[:c].abs().max()).item()
                def one():
                    for w in ws:
                        tma_linear(x, w, None, count, y, 0, **cfg)
                rows.append({"shape": name, "count": c, "impl": "tma", **cfg, "us": round(time_pass(one, len(ws)), 2),
                             "err": round(err, 5)})
                print(json.dumps(rows[-1]), flush=True)
        except Exception as exc:
            rows.append({"shape": name, "impl": "tma", **cfg, "error": repr(exc)[:300]})
            print(json.dumps(rows[-1]), flush=True)
    del ws
    torch.cuda.empty_cache()
    print(f"# {name} {time.time() - t0:.0f}s", flush=True)
    with open(os.path.join(OUT, "gemm_lab2.json"), "w") as fh:
        json.dump(rows, fh)
