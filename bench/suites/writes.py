"""The ``writes`` suite: latency of one block write (``model.append_block``: the 32 finished tokens appended
to the prefix cache, the next block's seed logits), eager and under torch.compile's default backend (what
``generate(compile_writes=True)`` runs), at prefix 512 and 2048. Rows follow per_check's, with mode
``write`` / ``write_compiled`` at N = 1, so ``bench.plot`` merges them into per_check.json, where the
end_to_end projections read them."""

from __future__ import annotations

import json
import traceback

import torch

from ..common import Deadline
from ._context import MODELS, BenchContext, timed


def run(args, ctx: BenchContext) -> list[dict]:
    rows: list[dict] = []
    deadline = Deadline(args.budget)
    for name in args.models or (MODELS if not args.quick else MODELS[:1]):
        torch._dynamo.reset()
        model = ctx.model(args, name)
        compiled = model.compiled_method("append_block")
        causal = model.config.family == "nld"
        for prefix in args.prefixes or ((512, 2048) if not args.quick else (512,)):
            if deadline.left() < 20:
                print("writes: time budget reached, stopping", flush=True)
                return rows
            cache = ctx.prefix(model, prefix, 1)
            block, _ = ctx.inputs(model, 1, 0, prefix)
            block = block[0]
            for t in (*cache.keys, *cache.values):  # as write_block(compiled=True) marks them
                torch._dynamo.maybe_mark_dynamic(t, 1)
            for mode, fn in (("write", model.append_block), ("write_compiled", compiled)):
                try:
                    with torch.no_grad():
                        _, first_s = ctx.first_call(lambda: fn(cache.keys, cache.values, block, causal))
                        times = timed(lambda: fn(cache.keys, cache.values, block, causal))
                    rows.append({"model": name, "prefix": prefix, "n_branches": 1, "mode": mode,
                                 "recompute_ratio": 1.0, **times, "first_call_s": first_s})
                except Exception as exc:
                    traceback.print_exc()
                    rows.append({"model": name, "prefix": prefix, "n_branches": 1, "mode": "error",
                                 "what": mode, "error": repr(exc)[:300]})
                print(json.dumps(rows[-1]), flush=True)
            del cache
        del model, compiled
        ctx.empty_cache()
    return rows
