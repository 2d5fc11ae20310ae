"""``bench.batched replay``'s arguments that configure the serving ``Engine`` of each replay: its attention
paths, CUDA graphs (and SpecFold's graph capacities, ``bench.batched_capacity``), step loop, KV pool size and
the compiled modes' backend."""

from __future__ import annotations

from bench.batched_capacity import add_capacity_arguments


def add_engine_arguments(ap) -> None:
    """The engine's arguments, on ``bench.batched``'s parser (checked there, after parsing)."""
    ap.add_argument("--attention", default="auto",
                    help="replay: the engine's attention paths, comma-separated (per_request, ragged; auto: the "
                         "engine's own choice on --device, a row naming the path it took)")
    ap.add_argument("--cuda-graphs", default="off", choices=("off", "on", "off,on"),
                    help="replay: the engine's passes launched (off) or replayed from CUDA graphs (on; ragged "
                         "attention only; 'off,on' both, a row's cuda_graphs says which)")
    add_capacity_arguments(ap)
    ap.add_argument("--loop", default="host", choices=("host", "device", "host,device"),
                    help="replay: Engine(loop=...), where each step's bookkeeping runs ('host,device' both, a row's "
                         "loop says which)")
    ap.add_argument("--rows-ahead", default="on", choices=("on", "off", "on,off"),
                    help="replay --loop host with graphs: the engine's rows_ahead (off: every row built after a block "
                         "write's seeds are read; 'on,off' both, timed on the same graphs, a row's rows_ahead says which)")
    ap.add_argument("--eager-step", action="store_true",
                    help="replay --loop device: Engine(compile_step=False), the step's bookkeeping not compiled")
    ap.add_argument("--pool-tokens", type=int, default=None,
                    help="replay: each slot of the engine's KV pool holds this many positions (default: what the "
                         "record's requests need)")
    ap.add_argument("--compile-backend", default="inductor",
                    help="replay: the *_compiled modes' Engine(compile_layers=...), a torch.compile backend")
