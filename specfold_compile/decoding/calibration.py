"""Offline draft-graph calibration from recorded vanilla traces (Spiffy, arXiv 2509.18085).

For every recorded step ``i`` of a block with states ``X_0 .. X_n`` and logits ``L_i = model(X_i)``, the
reference point is ``X' = X_{i+1}`` with ``L = L_i`` (exactly what Spiffy drafts from). Masked positions
of ``X'`` are ranked as at run time; for ``k = 1, 2, ...`` the positions committed between ``X'`` and
``X_{i+1+k}`` give a rank set ``S_k`` and the node ``(k, S_k)`` is counted if its draft would have been
exactly right (the committed tokens equal ``argmax L``), the state is not the finished block, and
``max(S_k) <= max_rank``. The kept nodes maximise own count + parents' counts (degree-1
accumulation), chosen greedily so the graph stays connected (every node is level 1 or has a kept parent).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import Counter

import torch

from .commit import rank_masked_positions
from .graph import GRAPH_VERSION, load_draft_graph, save_draft_graph
from .decoder import record_traces
from .defaults import CONFIDENCE_DTYPES, DEFAULTS

__all__ = ["calibrate", "count_rank_sets", "calibrate_cli", "BUILTIN_PROMPTS"]


def count_rank_sets(traces: dict, max_level: int = 4, max_rank: int | None = None) -> Counter:
    """Count ``(level, frozenset(ranks))`` occurrences in ``traces`` (from ``record_traces``)."""
    B = int(traces["block_size"])
    sb = traces.get("sub_block_size")
    mask_id = int(traces["mask_token_id"])
    max_rank = B - 1 if max_rank is None else max_rank
    counts: Counter = Counter()
    for blk in traces["blocks"]:
        states = [torch.tensor(s, dtype=torch.long) for s in blk["states"]]
        n = len(blk["conf"])
        for i in range(n):
            if i + 1 >= len(states):
                break
            root = states[i + 1]
            conf = torch.tensor(blk["conf"][i], dtype=torch.float32)
            am = blk["argmax"][i]
            order = rank_masked_positions(root, conf, mask_id, sb)
            if not order:
                continue
            rank_of = {p: r + 1 for r, p in enumerate(order)}
            for k in range(1, max_level + 1):
                j = i + 1 + k
                if j >= len(states) - 1:  # the last state is finished: never verified
                    break
                tgt = states[j]
                newly = [p for p in order if int(tgt[p]) != mask_id]
                if any(int(tgt[p]) != am[p] for p in newly):
                    break
                s = frozenset(rank_of[p] for p in newly)
                if not s or max(s) > max_rank or len(s) == len(order):
                    break
                counts[(k, s)] += 1
    return counts


def _fallback_nodes(max_level, max_rank):
    """Deterministic stream of extra nodes used to pad a graph when traces are too short: rank-prefix
    chains first (``(k, {1..n})``), then every rank set by size and lexicographic order."""
    for n in range(1, max_rank + 1):
        for k in range(1, min(n, max_level) + 1):
            yield (k, frozenset(range(1, n + 1)))
    for m in range(1, max_rank + 1):
        for comb in itertools.combinations(range(1, max_rank + 1), m):
            for k in range(1, min(m, max_level) + 1):
                yield (k, frozenset(comb))


def calibrate(traces: dict, size: int = 12, max_level: int = 4, max_rank: int | None = None) -> dict:
    """Build a draft graph dict of exactly ``size`` nodes from ``traces`` (see module docstring).

    When the traces hold fewer than ``size`` distinct useful nodes, the graph is padded with rank-prefix
    chains (``(k, {1..n})``) that attach to it. Raises ValueError if ``size`` nodes cannot fit under
    ``max_level`` / ``max_rank``.
    """
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"size must be an int >= 1, got {size!r}")
    B = int(traces["block_size"])
    if max_rank is None:
        max_rank = min(B - 1, 16)
    if not isinstance(max_rank, int) or not 1 <= max_rank <= B - 1:
        raise ValueError(f"max_rank must be in 1..{B - 1}, got {max_rank!r}")
    if not isinstance(max_level, int) or max_level < 1:
        raise ValueError(f"max_level must be an int >= 1, got {max_level!r}")
    counts = count_rank_sets(traces, max_level=max_level, max_rank=max_rank)

    def parents_of(node, pool):
        k, s = node
        return [q for q in pool if q[0] == k - 1 and q[1] < s]

    # degree-1 accumulation: own count + counts of all possible (observed) parents
    observed = list(counts)
    by_level: dict[int, list] = {}
    for nd in observed:
        by_level.setdefault(nd[0], []).append(nd)
    score = {}
    for nd in observed:
        k, s = nd
        score[nd] = counts[nd] + sum(counts[q] for q in by_level.get(k - 1, []) if q[1] < s)

    def sort_key(nd):
        return (-score.get(nd, 0), nd[0], len(nd[1]), sorted(nd[1]))

    chosen: list = []
    chosen_set: set = set()
    frontier = {nd for nd in observed if nd[0] == 1}
    while frontier and len(chosen) < size:
        best = min(frontier, key=sort_key)
        frontier.discard(best)
        chosen.append(best)
        chosen_set.add(best)
        for nd in by_level.get(best[0] + 1, []):
            if best[1] < nd[1] and nd not in chosen_set:
                frontier.add(nd)
    if len(chosen) < size:
        for nd in _fallback_nodes(max_level, max_rank):
            if len(chosen) >= size:
                break
            if nd in chosen_set:
                continue
            if nd[0] == 1 or parents_of(nd, chosen_set):
                chosen.append(nd)
                chosen_set.add(nd)
    if len(chosen) < size:
        raise ValueError(f"size {size} is more than the {len(chosen)} nodes that fit max_level={max_level}, "
                         f"max_rank={max_rank}")
    chosen.sort(key=lambda nd: (nd[0], len(nd[1]), sorted(nd[1])))
    graph = {
        "version": GRAPH_VERSION,
        "block_size": B,
        "max_rank": max(max(s) for _, s in chosen),
        "nodes": [{"level": k, "ranks": sorted(s), "count": counts.get((k, s), 0)} for k, s in chosen],
    }
    load_draft_graph(graph, B)  # sanity: valid and connected
    return graph


# ----------------------------------------------------------------------------------------------------
# CLI

BUILTIN_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is 17 * 23? Explain step by step.",
    "Write a function to check whether a string is a palindrome.",
    "Solve for x: 3x + 7 = 22.",
    "Write a Python function that merges two sorted lists.",
    "A train travels 120 km in 1.5 hours. What is its average speed?",
    "Implement binary search in Python.",
    "How many positive divisors does 360 have?",
]


def _load_model(spec: str, seed: int, device: str):
    from ..loading import load_model  # one loader for every command (checkpoint dir, preset, shipped model)

    return load_model(spec, device=device, seed=seed)


def _prompt_ids(model, texts_or_ids, n_random, seed):
    tok = getattr(model, "tokenizer", None)
    out = []
    for p in texts_or_ids:
        if isinstance(p, list):
            out.append(torch.tensor(p, dtype=torch.long))
        elif tok is not None:
            from ..loading import encode

            out.append(encode(model, p))
    if not out:  # no tokenizer (tiny random models): deterministic random prompts
        g = torch.Generator().manual_seed(seed)
        cfg = model.config
        special = {int(cfg.mask_token_id), int(cfg.eos_token_id)}
        filler = min(set(range(3)) - special)
        for _ in range(n_random):
            n = int(torch.randint(4, 24, (1,), generator=g))
            ids = torch.randint(0, int(cfg.vocab_size), (n,), generator=g)
            for sp in special:
                ids[ids == sp] = filler
            out.append(ids.long())
    return out


def calibrate_cli(argv=None) -> int:
    """``specfold calibrate``: record vanilla traces and write a calibrated draft graph JSON.

    Prompts file: one prompt per line, either plain text (needs ``model.tokenizer``) or a JSON list of
    token ids; JSONL objects with ``"prompt"`` / ``"prompt_ids"`` also work. Without a file: built-in
    prompts (random token ids when the model has no tokenizer).
    """
    ap = argparse.ArgumentParser(prog="specfold calibrate", description=calibrate_cli.__doc__)
    ap.add_argument("--model", default=None, help="preset name or checkpoint dir (default: the shipped model)")
    ap.add_argument("--prompts", default=None, help="prompts file (text / JSON id lists / JSONL)")
    ap.add_argument("--num-prompts", type=int, default=50)
    ap.add_argument("--size", type=int, default=12, help="number of graph nodes D")
    ap.add_argument("--max-level", type=int, default=4)
    ap.add_argument("--max-rank", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens)
    ap.add_argument("--threshold", type=float, default=DEFAULTS.threshold)
    ap.add_argument("--confidence-dtype", choices=CONFIDENCE_DTYPES, default=DEFAULTS.confidence_dtype,
                    help="the dtype of the softmax and the threshold comparison (generate's confidence_dtype)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--traces-out", default=None, help="also write the recorded traces (JSON)")
    ap.add_argument("--out", required=True, help="output graph JSON path")
    a = ap.parse_args(argv)
    model = _load_model(a.model, a.seed, a.device)
    items = []
    if a.prompts:
        with open(a.prompts, encoding="utf-8") as f:
            for line in f:
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                try:
                    v = json.loads(line)
                except json.JSONDecodeError:
                    v = line
                if isinstance(v, dict):
                    v = v.get("prompt_ids", v.get("prompt"))
                items.append(v)
    else:
        items = list(BUILTIN_PROMPTS)
    prompts = _prompt_ids(model, items[: a.num_prompts], a.num_prompts, a.seed)
    dev = torch.device(a.device)
    traces = record_traces(model, [p.to(dev) for p in prompts], max_new_tokens=a.max_new_tokens,
                           threshold=a.threshold, confidence_dtype=a.confidence_dtype)
    if a.traces_out:
        with open(a.traces_out, "w", encoding="utf-8") as f:
            json.dump(traces, f)
    graph = calibrate(traces, size=a.size, max_level=a.max_level, max_rank=a.max_rank)
    save_draft_graph(graph, a.out)
    n_steps = sum(len(b["conf"]) for b in traces["blocks"])
    print(f"calibrated {len(graph['nodes'])} nodes from {len(prompts)} prompts, {len(traces['blocks'])} blocks, "
          f"{n_steps} steps -> {a.out}", file=sys.stderr)
    return 0
