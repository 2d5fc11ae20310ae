"""``specfold generate --prompts-file FILE``: decode many prompts together through the serving ``Engine``
(``serving.generate_batch``) and write one JSON line a prompt.

The file holds one prompt a line as JSON Lines: a JSON string, or an object with a string ``"prompt"``
(other fields are ignored); blank lines are skipped. Each output line is ``{"index", "text", "tokens",
"nfe", "blocks", "time_s"}`` in the file's order (``time_s``: from the request's admission to its end),
and a last line on stderr gives the batch's totals. Every request's tokens are those of decoding its
prompt alone (docs/serving.md). The wall time counts everything the engine does on first use (with
``--cuda-graphs``, its captures).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .arguments import UsageError, input_file

# generate's options the batched engine does not take (the flag, and its value when not given)
SINGLE_ONLY = {"compile_writes": ("--compile-writes", False), "fuse_boundaries": ("--fuse-boundaries", False)}


def read_prompts(path: str | Path, arg: str = "--prompts-file") -> list[str]:
    """The prompts of a JSON Lines file: each non-blank line a JSON string or an object with a string
    ``"prompt"``; a one-line error naming the line otherwise."""
    prompts = []
    text = input_file(path, arg).read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{arg}: line {number}: expected JSON (a string, or an object with a \"prompt\" "
                             f"string), got {line[:40]!r} ({e.msg})") from None
        if isinstance(value, dict):
            value = value.get("prompt")
        if not isinstance(value, str):
            raise UsageError(f"{arg}: line {number}: expected a JSON string or an object with a \"prompt\" "
                             f"string, got {line[:40]!r}")
        prompts.append(value)
    if not prompts:
        raise UsageError(f"{arg}: {str(path)!r} holds no prompt")
    return prompts


def check_batch_arguments(args) -> None:
    """Before anything loads: the file's prompts, and no option the engine does not take."""
    for name, (flag, unset) in SINGLE_ONLY.items():
        if getattr(args, name, unset) != unset:
            raise UsageError(f"{flag}: not with --prompts-file (the batched engine does not take it; "
                             "docs/serving.md)")
    args.prompts = read_prompts(args.prompts_file)


def cmd_generate_batch(args) -> int:
    from ..loading import decode, encode, load_model, resolve_draft_graph  # noqa: PLC0415
    from ..serving import generate_batch  # noqa: PLC0415

    model = load_model(args.model, device=args.device, chat_template=not args.no_chat_template)
    ids = [encode(model, p).to(args.device) for p in args.prompts]
    cuda_graphs = {None: False, "cuda": True, "eager": "eager"}[args.cuda_graphs]
    t0 = time.perf_counter()
    results = generate_batch(model, ids, mode=args.mode, max_new_tokens=args.max_new_tokens,
                             threshold=args.threshold, draft_budget=args.draft_budget,
                             draft_graph=resolve_draft_graph(args.model, args.draft_graph),
                             max_requests=args.max_requests, tau=args.tau if args.mode == "specfold" else None,
                             cuda_graphs=cuda_graphs, loop=args.loop)
    wall = time.perf_counter() - t0
    tokens = 0
    for i, res in enumerate(results):
        tokens += len(res.tokens)
        print(json.dumps({"index": i, "text": decode(model, res.tokens), "tokens": len(res.tokens), "nfe": res.nfe,
                          "blocks": res.blocks, "time_s": round(res.wall_time_s, 6)}))
    slots = len(ids) if args.max_requests is None else min(args.max_requests, len(ids))
    print(f"mode={args.mode} requests={len(ids)} slots={slots} tokens={tokens} time={wall:.3f}s "
          f"tokens/s={tokens / max(wall, 1e-9):.1f}", file=sys.stderr)
    return 0
