"""The serving engine with CUDA graphs against the launched engine, on the tiny models of both families:
the same tokens, fold masks and calls for every serving mode (the CPU tests run the graphs' bookkeeping
with ``cuda_graphs="eager"``; this runs the captures themselves), with SpecFold's graphs packing a tenth
of the draft positions, with its attention over the packed rows (``packed_attention=True``), with the layers
compiled (``compile_layers=True``) and with the device loop
(``loop="device"``: its bookkeeping replayed from graphs too, against the launched host loop), and each
one's wall time::

    PYTHONPATH=. python bench/graphs_check.py [--device cuda] [--only "device loop"]
"""

from __future__ import annotations

import argparse
import time

import torch

from specfold_compile.serving import BatchGraphs, Engine, RequestParams
from specfold_compile.testing import TINY_FAMILIES, tiny_model

MODES = (("vanilla", None), ("spiffy", None), ("specfold", 0.0), ("specfold", 0.3))
# SpecFold at tau = 0.3 also on graphs that pack a tenth of the draft positions, no floor nor margin: packed
# GEMMs smaller than the rows, and overflowed forwards replayed at the next capacity
PACKED = dict(fold_capacity=0.1, min_packed=0, capacity_spread=0)
# and SpecFold's attention over the packed rows (BatchGraphs(packed_attention=True)), its layers compiled
PACKED_ATTENTION = (("specfold", 0.3, "packed attention"),)
# and Spiffy and SpecFold with the layers compiled (Inductor), launched against replayed, both compiled
COMPILED = (("spiffy", None, "compiled"), ("specfold", 0.3, "compiled"))
# and every mode on the device loop from graphs against the launched host loop
DEVICE_LOOP = (("vanilla", None, "device loop"), ("spiffy", None, "device loop"), ("specfold", 0.3, "device loop"))


def decode(model, mode: str, tau, graphs, requests: int = 12, compile_layers=False,
           loop: str = "host") -> tuple[list, list, float]:
    replay = "cuda" if model.embed_tokens.weight.is_cuda else "eager"
    if graphs == "packed":
        graphs = BatchGraphs(model, 4, 160, replay, **PACKED)
    elif graphs == "packed attention":
        graphs = BatchGraphs(model, 4, 160, replay, compile_layers=compile_layers, packed_attention=True)
    engine = Engine(model, max_requests=4, max_tokens_per_request=160, mode=mode, tau=tau, attention="ragged",
                    cuda_graphs=graphs, compile_layers=compile_layers, loop=loop)
    gen = torch.Generator().manual_seed(0)
    ids = [engine.add_request(torch.randint(0, 90, (int(torch.randint(3, 40, (1,), generator=gen)),), generator=gen),
                              RequestParams(max_new_tokens=int(torch.randint(5, 64, (1,), generator=gen)),
                                            stop_at_eos=False)) for _ in range(requests)]
    t0 = time.perf_counter()
    list(engine.run())
    wall = time.perf_counter() - t0
    outs = [engine.output(i) for i in ids]
    if any(o.status != "finished" for o in outs):
        raise SystemExit(f"{mode}: a request did not finish: {[o.error for o in outs if o.error]}")
    if engine.stats.overflows:
        print(f"  {mode} tau={tau}: {engine.stats.overflows} overflowed forwards replayed again", flush=True)
    return [o.result.tokens for o in outs], [o.fold_masks for o in outs], wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--only", default=None, choices=("plain", "packed", "packed attention", "compiled", "device loop"),
                    help="one kind of case (default: all)")
    args = ap.parse_args(argv)
    graphs = True if args.device == "cuda" else "eager"
    failed = 0
    for family in TINY_FAMILIES:
        model = tiny_model(family).to(args.device)
        for case in MODES + (("specfold", 0.3, "packed"),) + PACKED_ATTENTION + COMPILED + DEVICE_LOOP:
            (mode, tau), kind = case[:2], case[2] if len(case) > 2 else ""
            packed, compiled = kind in ("packed", "packed attention"), kind in ("compiled", "packed attention")
            if args.only is not None and (kind or "plain") != args.only:
                continue
            tok_l, masks_l, wall_l = decode(model, mode, tau, False, compile_layers=compiled)
            tok_g, masks_g, wall_g = decode(model, mode, tau, kind if packed else graphs, compile_layers=compiled,
                                            loop="device" if kind == "device loop" else "host")
            same = tok_l == tok_g and all(len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
                                          for a, b in zip(masks_l, masks_g))
            failed += not same
            print(f"{family} {mode} tau={tau}{' ' + kind if kind else ''}: "
                  f"{'same' if same else 'DIFFERENT'} tokens and masks; launched {wall_l:.2f} s, graphs "
                  f"{wall_g:.2f} s", flush=True)
    return int(failed > 0)


if __name__ == "__main__":
    raise SystemExit(main())
