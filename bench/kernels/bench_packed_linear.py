"""Benchmark packed_linear at the Fast-dLLM-v2 projection shapes (bf16), with the floor and the
worst relative error against the float32 reference."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402  (sets TRITON_INTERPRET on CPU before the kernels import)

import torch  # noqa: E402

from specfold_compile.kernels.packed_linear import packed_linear  # noqa: E402
from specfold_compile.kernels.packed_linear_ref import packed_linear_ref  # noqa: E402


def layers(m):
    h, d = m["hidden"], m["d"]
    return {
        "qkv": (h, (m["hq"] + 2 * m["hkv"]) * d, True),
        "o_proj": (m["hq"] * d, h, False),
        "gate_up": (h, 2 * m["ffn"], False),
        "down": (m["ffn"], h, False),
    }


def main(argv=None):
    args = C.parse_args(argv, __doc__)
    models, block, _, ns = C.configs(args)
    dev = C.device()
    dt = torch.bfloat16
    rows = []
    for mname, m in models.items():
        for lname, (K, M, has_bias) in layers(m).items():
            w = (torch.randn(M, K, device=dev) * K ** -0.5).to(dt)
            b = torch.randn(M, device=dev).to(dt) if has_bias else None
            for N in ns:
                R = N * block
                x = torch.randn(R, K, device=dev).to(dt)
                for frac in (1.0, 0.25):
                    c = max(1, int(R * frac))
                    count = torch.tensor(c, dtype=torch.int64, device=dev)
                    y = packed_linear(x, w, b, count)
                    ref = packed_linear_ref(x.float(), w.float(), None if b is None else b.float())
                    err = C.rel_err(y[:c], ref[:c])
                    ms = C.bench(lambda: packed_linear(x, w, b, count), args.quick)
                    fl = C.floor_ms(M * K * 2 + c * K * 2 + c * M * 2, 2.0 * c * M * K)
                    torch_ms = C.bench(lambda: torch.nn.functional.linear(x[:c], w, b), args.quick)
                    rows.append(dict(model=mname, layer=lname, N=N, rows=R, count=c, K=K, M=M, ms=ms,
                                     torch_linear_ms=torch_ms, **fl, frac_of_floor=fl["floor_ms"] / ms,
                                     max_rel_err=err))
    return C.emit("packed_linear", rows, args)


if __name__ == "__main__":
    main()
