# Session 9 attempt, reverted (see README.md here).
"""GPU lab: new count-aware GEMM configs vs cuBLAS (exact rows, oracle) and the current op (head + spill)."""
import json, os, sys, time, math
import torch, triton
sys.path.insert(0, os.path.dirname(__file__))
from stream_linear import stream_linear
from bench.kernels.bench_cublas_gemm import cold_weights, time_pass
from specfold_compile import fold_ops

OUT = os.environ.get("OUT", ".")
SHAPES = {  # name: (out, in)
    "1.5b_qkv": (2048, 1536), "1.5b_gate_up": (17920, 1536), "1.5b_down": (1536, 8960),
    "7b_qkv": (4608, 3584), "7b_gate_up": (37888, 3584), "7b_down": (3584, 18944),
}
only = os.environ.get("SHAPES")
if only:
    SHAPES = {k: v for k, v in SHAPES.items() if k in only.split(",")}
R = 544
COUNTS = [64, 129, 176, 256, 336]
BASE = [(64, 128, 4, 4), (128, 64, 4, 4), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 5), (256, 64, 8, 3)]
ROWS = [(64, 1), (64, 2), (128, 1)]
rows_out = []
t_start = time.time()


def log(d):
    rows_out.append(d)
    print(json.dumps(d), flush=True)


def auto_split(M, K, BN, BK):
    tiles = triton.cdiv(M, BN)
    s = 1
    while tiles * s < 132 and K // (BK * (s * 2)) >= 4:
        s *= 2
    return s


def time_cfg(x, ws, y, count, cfg, row_start=0):
    def one():
        for w in ws:
            stream_linear(x, w, None, count, y, row_start, **cfg)
    return time_pass(one, len(ws))


for name, (M, K) in SHAPES.items():
    ws = cold_weights(M, K)
    x = torch.randn(R, K, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(R, M, device="cuda", dtype=torch.bfloat16)
    count = torch.tensor(129, device="cuda")
    ref = (x.float() @ ws[0].float().t())
    cfgs = []
    for BN, BK, w, s in BASE:
        for BR, SUB in ROWS:
            if BR * SUB * BN > 128 * 128 and BN > 128:
                continue
            for split in sorted({1, auto_split(M, K, BN, BK)}):
                cfgs.append(dict(BLOCK_R=BR, SUB=SUB, BLOCK_N=BN, BLOCK_K=BK, num_warps=w, num_stages=s, SPLIT_K=split))
    # oracle and current op
    for c in COUNTS:
        xs = x[:c]
        ys = y[:c]
        def one():
            for w in ws:
                torch.mm(xs, w.t(), out=ys)
        log({"shape": name, "count": c, "impl": "cublas_exact", "us": round(time_pass(one, len(ws)), 2)})
        cnt = torch.tensor(c, device="cuda")
        def op():
            for w in ws:
                fold_ops.packed_linear(x, w, None, cnt, 0.45, "triton", 2.0)
        log({"shape": name, "count": c, "impl": "op_current", "us": round(time_pass(op, len(ws)), 2)})
    # stage 1
    stage1 = []
    for cfg in cfgs:
        res = {}
        try:
            for c in (129, 256):
                count.fill_(c)
                y.zero_()
                stream_linear(x, ws[0], None, count, y, 0, **cfg)
                err = ((y[:c].float() - ref[:c]).abs().max() / ref[:c].abs().max()).item()
                res[c] = time_cfg(x, ws, y, count, cfg)
            d = {"shape": name, "stage": 1, **cfg, "us129": round(res[129], 2), "us256": round(res[256], 2), "err": err}
            log(d)
            stage1.append((cfg, res))
        except Exception as exc:
            log({"shape": name, "stage": 1, **cfg, "error": repr(exc)[:200]})
    top = []
    for c in (129, 256):
        for cfg, _ in sorted(stage1, key=lambda t: t[1][c])[:4]:
            if cfg not in top:
                top.append(cfg)
    for cfg in top:
        for go in (False, True):
            cfg2 = dict(cfg, GROUPS_OUTER=go)
            for c in COUNTS:
                count.fill_(c)
                log({"shape": name, "stage": 2, **cfg2, "count": c, "us": round(time_cfg(x, ws, y, count, cfg2), 2)})
            # as a spill behind a 128-row cuBLAS head
            for c in COUNTS:
                if c <= 128:
                    continue
                count.fill_(c)
                xs, ys = x[:128], y[:128]
                def both():
                    for w in ws:
                        torch.mm(xs, w.t(), out=ys)
                        stream_linear(x, w, None, count, y, 128, **cfg2)
                log({"shape": name, "stage": 3, **cfg2, "count": c, "head": 128, "us": round(time_pass(both, len(ws)), 2)})
    del ws
    torch.cuda.empty_cache()
    print(f"# {name} done at {time.time() - t_start:.0f}s", flush=True)
    with open(os.path.join(OUT, "gemm_lab.json"), "w") as fh:
        json.dump(rows_out, fh)
