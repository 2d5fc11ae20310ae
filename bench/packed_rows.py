"""What a packed batch of rows costs one decoder layer's position-wise parts (q/k/v with RoPE, the output
projection, the MLP: what SpecFold's gates pack), by row count, on a random model of a real shape:
the floor below which packing fewer rows saves nothing (``serving.graphs.MIN_PACKED``).

Each point is the median of ``--replays`` replays, each between two CUDA events, of a CUDA graph of
the three pieces over ``M`` rows (``bench.common.time_cuda_graph``; bf16; on the CPU float32 calls,
wall time)::

    python -m bench.packed_rows --models fast-dllm-v2-1.5b,fast-dllm-v2-7b [--rows 64,128,...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from bench.common import check_output, time_cuda_graph

ROWS = (64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)


def _pieces(layer, x, tables):
    q, k, v = layer.qkv(x, tables)
    return layer.mlp_out(x + layer.attn_out(q)), k, v


def time_rows(model, rows: int, replays: int) -> float:
    """Microseconds one layer's position-wise parts take over ``rows`` packed rows."""
    layer, device = model.layers[0], model.embed_tokens.weight.device
    gen = torch.Generator(device=device).manual_seed(rows)
    x = torch.randn(rows, model.config.hidden_size, generator=gen, device=device, dtype=model.embed_tokens.weight.dtype)
    tables = model.position_tables(torch.arange(rows, device=device) % 4096)
    return 1e3 * time_cuda_graph(lambda: _pieces(layer, x, tables), replays)[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="fast-dllm-v2-1.5b,fast-dllm-v2-7b")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--override", default="", metavar="FIELD=INT,...", help="model config fields (tiny runs)")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from bench.common import versions
    from bench.trace_driven import parse_override
    from specfold_compile.models import build

    out = args.out or str(Path(os.environ.get("OUT") or ".") / "packed_rows.json")
    check_output(ap, out)
    override = parse_override(ap, args.override)
    cuda = args.device == "cuda"
    rows = []
    with torch.inference_mode():
        for name in args.models.split(","):
            model = build(name, device=args.device, dtype=torch.bfloat16 if cuda else torch.float32, seed=0, **override)
            for m in (int(r) for r in args.rows.split(",")):
                us = time_rows(model, m, args.replays)
                rows.append({"model": name, "rows": m, "us": us, "us_per_row": us / m})
                print(json.dumps(rows[-1]), flush=True)
            del model
    Path(out).write_text(json.dumps({"versions": versions(), "suite": "packed_rows", "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
