"""The task-suite runner: decode problems with vanilla / Spiffy / SpecFold and score them.

``evaluate`` measures, per task and mode, accuracy, NFE, tokens/s, accepted drafts and branches per
call and the recompute ratio (docs/SPEC.md section 4), and checks that Spiffy's tokens equal vanilla's
(P5). Every mode is warmed up first (compilation, Dynamo's recompiles for dynamic shapes), so the timed
runs measure steady-state decoding and the compile time is reported on its own.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field

import torch

from ..decoding.defaults import DEFAULTS
from ..loading import decode, encode

MODES = ("vanilla", "spiffy", "specfold")
RESULT_KEYS = ("accuracy", "nfe", "tokens_per_s", "recompute_ratio", "n", "accepted_per_call", "branches_per_call")


class Progress:
    """A ``\\r`` counter on stderr."""

    def __init__(self, label: str, total: int, enabled: bool = True) -> None:
        self.label, self.total, self.enabled, self.t0 = label, total, enabled, time.perf_counter()
        self.update(0)

    def update(self, i: int) -> None:
        if self.enabled:
            el = time.perf_counter() - self.t0
            sys.stderr.write(f"\r  {self.label}: {i}/{self.total} ({el:.0f}s)   ")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def compiled_model(model, tau: float, kernels: str = "auto", fold_head: bool = False):
    """SpecFold as evaluated: every call the backend folds folds, launched ones too (``fold_launched``:
    eval measures what folding decodes, which launched calls would otherwise leave to the plain graph)."""
    return torch.compile(model, backend="specfold", options={"tau": float(tau), "kernels": kernels,
                                                            "fold_head": bool(fold_head), "fold_launched": True})


def verify_graphs(replay: str | None, target, device: str, forward=None):
    """A ``VerifyGraphs`` of ``target`` (and its verification ``forward``, see ``VerifyGraphs``)
    replaying with ``replay`` ("cuda" or "eager"; None: launched calls, returns None)."""
    if replay is None:
        return None
    if replay == "cuda" and torch.device(device).type != "cuda":
        raise ValueError(f"cuda_graphs: 'cuda' needs a CUDA device, got device {device!r} ('eager' runs the "
                         f"same loop without graphs)")
    from ..decoding import VerifyGraphs  # noqa: PLC0415

    return VerifyGraphs(target, replay=replay, forward=forward)


def unique_graphs() -> int | None:
    """Dynamo's count of compiled graphs so far (None where this torch does not keep it)."""
    try:
        from torch._dynamo.utils import counters  # noqa: PLC0415

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001
        return None


@dataclass
class RunStats:
    """Everything measured for one (task, mode) run."""

    tokens: list[list[int]] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    nfe: int = 0
    gen_tokens: int = 0
    wall: float = 0.0
    calls: int = 0
    accepted: int = 0
    branches: int = 0
    recompute_ratio: float | None = None

    def summary(self) -> dict:
        n = len(self.tokens)
        return {
            "accuracy": sum(self.correct) / n if n else float("nan"),
            "nfe": self.nfe / n if n else float("nan"),
            "tokens_per_s": self.gen_tokens / self.wall if self.wall > 0 else float("nan"),
            "recompute_ratio": self.recompute_ratio,
            "n": n,
            "accepted_per_call": self.accepted / self.calls if self.calls else 0.0,
            "branches_per_call": self.branches / self.calls if self.calls else 0.0,
            "generated_tokens": self.gen_tokens,
            "decode_seconds": self.wall,
        }


def decode_problems(model, target, mode: str, problems, *, max_new_tokens: int, threshold: float,
                    draft_budget: int, draft_graph, device: str = "cpu", progress: str | None = None,
                    stats: bool = False, all_logits: bool = False, cuda_graphs=False,
                    unsafe_run_code: bool = False) -> RunStats:
    """Decode every problem with ``target`` (the eager model, the compiled model or a wrapper) and score.

    ``mode`` is the decoding mode of ``generate`` ("vanilla" or "spiffy"). With ``stats``, the whole run is
    inside one ``collect_stats()`` and the overall recompute ratio is recorded. ``all_logits``: as
    ``generate``'s (a ``fold_head`` model needs every position's logits to gate its head); ``cuda_graphs``:
    as ``generate``'s (pass one ``VerifyGraphs`` of ``target`` to keep its graphs across problems).
    ``unsafe_run_code``: score code responses unsandboxed where no sandbox can be built (``tasks/sandbox.py``).
    """
    from contextlib import nullcontext  # noqa: PLC0415

    from ..backend import collect_stats  # noqa: PLC0415
    from ..decoding import generate  # noqa: PLC0415
    from ..tasks import score_many  # noqa: PLC0415

    out = RunStats()
    bar = Progress(progress, len(problems), enabled=progress is not None)
    ctx = collect_stats() if stats else nullcontext()
    with ctx as s:
        for i, p in enumerate(problems):
            ids = encode(model, p.prompt).to(device)
            res = generate(target, ids, mode=mode, max_new_tokens=max_new_tokens, threshold=threshold,
                           draft_budget=draft_budget, draft_graph=draft_graph if mode == "spiffy" else None,
                           all_logits=all_logits, cuda_graphs=cuda_graphs)
            out.tokens.append(list(res.tokens))
            out.nfe += res.nfe
            out.gen_tokens += len(res.tokens)
            out.wall += res.wall_time_s
            out.calls += res.num_calls
            out.accepted += sum(st.accepted for st in res.steps)
            out.branches += sum(st.branches for st in res.steps)
            bar.update(i + 1)
        if stats:
            r = s.recompute_ratio
            out.recompute_ratio = None if math.isnan(r) else float(r)
    bar.close()
    out.correct = [bool(c) for c in score_many(problems, [decode(model, t) for t in out.tokens],
                                               unsafe_run_code=unsafe_run_code)]
    return out


def warm_up(model, target, mode: str, *, max_new_tokens: int, threshold: float, draft_budget: int,
            draft_graph, device: str = "cpu", n: int = 3, seed: int = 0, all_logits: bool = False,
            cuda_graphs=False) -> float:
    """Decode a few calib-split prompts (one per task, different lengths) so that compilation and
    Dynamo's recompile for dynamic shapes happen before timing. Returns the seconds spent."""
    from ..decoding import generate  # noqa: PLC0415
    from ..tasks import TASKS, sample  # noqa: PLC0415

    t0 = time.perf_counter()
    for k in range(n):
        p = sample(TASKS[k % len(TASKS)], "calib", 1, seed=seed + 1000 + k)[0]
        generate(target, encode(model, p.prompt).to(device), mode=mode, max_new_tokens=max_new_tokens,
                 threshold=threshold, draft_budget=draft_budget, draft_graph=draft_graph if mode == "spiffy" else None,
                 all_logits=all_logits, cuda_graphs=cuda_graphs)
    return time.perf_counter() - t0


def _variants(modes, budgets) -> list[tuple[str, str, int]]:
    """(name, mode, draft budget) per run: vanilla once, Spiffy and SpecFold once per budget (named
    ``{mode}_b{budget}`` when there are several)."""
    out = []
    for mode in modes:
        if mode == "vanilla":
            out.append(("vanilla", mode, 0))
        else:
            out.extend((mode if len(budgets) == 1 else f"{mode}_b{b}", mode, b) for b in budgets)
    return out


def evaluate(model, tasks, modes, *, limit: int, tau: float = 0.1, draft_budgets=(DEFAULTS.draft_budget,),
             draft_graph=None, max_new_tokens: int = DEFAULTS.max_new_tokens, threshold: float = DEFAULTS.threshold,
             seed: int = 0, device: str = "cpu", kernels: str = "auto", fold_head: bool = False, progress: bool = True,
             cuda_graphs: str | None = None,
             unsafe_run_code: bool = False) -> dict:
    """The ``results`` / equality / timing part of the eval report (``specfold eval``).

    With several draft budgets, the Spiffy and SpecFold modes run once per budget under the names
    ``spiffy_b{budget}`` / ``specfold_b{budget}``; with one budget they keep their plain names.
    ``cuda_graphs``: None (launched calls), "cuda" or "eager" (``VerifyGraphs``' replay): one
    ``VerifyGraphs`` per target, kept from the warm-up (which captures) through the timed runs.
    """
    from ..tasks import sample  # noqa: PLC0415

    variants = _variants(modes, list(draft_budgets))
    compiled = compiled_model(model, tau, kernels, fold_head) if "specfold" in modes else None
    targets = {"vanilla": model, "spiffy": model, "specfold": compiled}
    # fold_head gates the head on every row: it cannot act on the masked rows alone (logit_positions)
    all_logits = {"vanilla": False, "spiffy": False, "specfold": fold_head}
    shared = verify_graphs(cuda_graphs, model, device)  # vanilla and Spiffy call the same eager model
    graphs = {"vanilla": shared, "spiffy": shared,
              "specfold": verify_graphs(cuda_graphs, compiled, device) if compiled is not None else None}
    warm: dict[str, float] = {}
    graphs_before = unique_graphs()
    for name, mode, b in variants:
        gen_mode = "vanilla" if mode == "vanilla" else "spiffy"
        if progress:
            print(f"warm-up {name} ...", file=sys.stderr)
        warm[name] = warm_up(model, targets[mode], gen_mode, max_new_tokens=max_new_tokens, threshold=threshold,
                             draft_budget=b, draft_graph=draft_graph, device=device, seed=seed,
                             all_logits=all_logits[mode], cuda_graphs=graphs[mode] or False)
    graphs_after_warmup = unique_graphs()

    results: dict = {}
    equal: dict = {}
    specfold_equal: dict = {}
    wall0 = time.perf_counter()
    for task in tasks:
        problems = sample(task, "test", limit, seed)
        results[task] = {}
        toks: dict[str, list] = {}
        for name, mode, b in variants:
            gen_mode = "vanilla" if mode == "vanilla" else "spiffy"
            run = decode_problems(model, targets[mode], gen_mode, problems, max_new_tokens=max_new_tokens,
                                  threshold=threshold, draft_budget=b, draft_graph=draft_graph, device=device,
                                  progress=f"{task}/{name}" if progress else None, stats=mode == "specfold",
                                  all_logits=all_logits[mode], cuda_graphs=graphs[mode] or False,
                                  unsafe_run_code=unsafe_run_code)
            results[task][name] = run.summary()
            toks[name] = run.tokens
        if "vanilla" in toks:
            sp = [n for n, m, _ in variants if m == "spiffy"]
            sf = [n for n, m, _ in variants if m == "specfold"]
            equal[task] = all(toks[n] == toks["vanilla"] for n in sp) if sp else None
            specfold_equal[task] = {n: sum(a == v for a, v in zip(toks[n], toks["vanilla"])) / len(toks[n])
                                    for n in sf} if sf else None
        else:
            equal[task] = None
            specfold_equal[task] = None
    graphs_end = unique_graphs()
    return {
        "results": results,
        "spiffy_tokens_equal_vanilla": equal,
        "specfold_sequences_equal_vanilla_share": specfold_equal,
        "compile_seconds": warm.get("specfold", max((v for k, v in warm.items() if k.startswith("specfold")),
                                                    default=None)),
        "warmup_seconds": warm,
        "eval_seconds": time.perf_counter() - wall0,
        "dynamo_graphs": {"after_warmup": None if graphs_before is None else graphs_after_warmup - graphs_before,
                          "compiled_during_timed_runs": None if graphs_end is None else graphs_end - graphs_after_warmup},
    }
