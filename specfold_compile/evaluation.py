"""Task evaluation of vanilla / Spiffy / SpecFold decoding, the ``tau`` sweep, and draft-graph calibration.

``specfold eval``   accuracy, NFE, tokens/s, accepted drafts and branches per call, recompute ratio, per
                    task and mode (SPEC section 4), with the Spiffy == vanilla losslessness check (P5).
``specfold sweep``  per ``tau``: SpecFold accuracy per task, tokens/s, recompute ratio, and the fidelity of
                    the folded verification logits at still-masked draft positions, next to the
                    zero-compute "copy the parent branch's logits" baseline.
``calibrate_default`` records vanilla traces on the calib split and writes the shipped model's draft graph.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import arguments
from .decoding.cuda_graphs import add_cuda_graphs_argument, check_cuda_graphs_argument, graphs_for_cli
from .decoding.defaults import DEFAULTS
from .loading import DEFAULT_MODEL_DIR, decode, encode, load_model, resolve_draft_graph

__all__ = [
    "eval_cli", "sweep_cli", "evaluate", "sweep", "calibrate_default", "FidelityRecorder",
    "fidelity_positions", "summarize_fidelity", "DEFAULT_DRAFT_GRAPH", "MODES", "MACHINE",
]

MODES = ("vanilla", "spiffy", "specfold")
DEFAULT_DRAFT_GRAPH = DEFAULT_MODEL_DIR / "draft_graph.json"
MACHINE = "CPU, 2 shared cores (OMP_NUM_THREADS=1, torch.set_num_threads(1)); other jobs ran concurrently"
RESULT_KEYS = ("accuracy", "nfe", "tokens_per_s", "recompute_ratio", "n", "accepted_per_call", "branches_per_call")


# ----------------------------------------------------------------------------------------------------
# helpers


def _add_unsafe_run_code_argument(ap) -> None:
    ap.add_argument("--unsafe-run-code", action="store_true",
                    help="where no sandbox can be built (bubblewrap missing, namespaces denied), run the "
                    "model-generated code of the code task WITHOUT isolation, as the invoking user")


def _check_code_sandbox(tasks, unsafe_run_code: bool) -> None:
    """Before loading anything: the code task needs a sandbox (or --unsafe-run-code)."""
    from .tasks.sandbox import SandboxUnavailable, require_sandbox  # noqa: PLC0415

    if "code" in tasks and not unsafe_run_code:
        try:
            require_sandbox()
        except SandboxUnavailable as e:
            raise SystemExit(f"--tasks code: {e}") from None


def versions() -> dict:
    try:
        import triton  # noqa: PLC0415

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - optional dependency
        triton_version = None
    return {"python": platform.python_version(), "torch": torch.__version__, "triton": triton_version,
            "platform": platform.platform()}


def _model_name(model, spec):
    if spec not in (None, "default"):
        return str(spec)
    return str(DEFAULT_MODEL_DIR) if getattr(model, "tokenizer", None) is not None else "tiny-fast-dllm-v2"


class _Progress:
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


def compiled_model(model, tau: float, kernels: str = "torch", fold_head: bool = False):
    """SpecFold as evaluated: every call the backend folds folds, launched ones too (``fold_launched``:
    eval measures what folding decodes, which launched calls would otherwise leave to the plain graph)."""
    return torch.compile(model, backend="specfold", options={"tau": float(tau), "kernels": kernels,
                                                            "fold_head": bool(fold_head), "fold_launched": True})


def _unique_graphs() -> int | None:
    try:
        from torch._dynamo.utils import counters  # noqa: PLC0415

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001
        return None


# ----------------------------------------------------------------------------------------------------
# decoding runs


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


def _decode_kwargs(args, budget: int) -> dict:
    return {"max_new_tokens": args.max_new_tokens, "threshold": args.threshold, "draft_budget": budget}


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

    from .backend import collect_stats  # noqa: PLC0415
    from .decoding import generate  # noqa: PLC0415
    from .tasks import score_many  # noqa: PLC0415

    out = RunStats()
    bar = _Progress(progress, len(problems), enabled=progress is not None)
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
    from .decoding import generate  # noqa: PLC0415
    from .tasks import TASKS, sample  # noqa: PLC0415

    t0 = time.perf_counter()
    for k in range(n):
        p = sample(TASKS[k % len(TASKS)], "calib", 1, seed=seed + 1000 + k)[0]
        generate(target, encode(model, p.prompt).to(device), mode=mode, max_new_tokens=max_new_tokens,
                 threshold=threshold, draft_budget=draft_budget, draft_graph=draft_graph if mode == "spiffy" else None,
                 all_logits=all_logits, cuda_graphs=cuda_graphs)
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------------
# eval


def evaluate(model, tasks, modes, *, limit: int, tau: float = 0.1, draft_budgets=(DEFAULTS.draft_budget,),
             draft_graph=None, max_new_tokens: int = DEFAULTS.max_new_tokens, threshold: float = DEFAULTS.threshold,
             seed: int = 0, device: str = "cpu", kernels: str = "torch", fold_head: bool = False, progress: bool = True,
             cuda_graphs: str | None = None,
             unsafe_run_code: bool = False) -> dict:
    """The ``results`` / equality / timing part of the eval report (see ``eval_cli``).

    With several draft budgets, the Spiffy and SpecFold modes run once per budget under the names
    ``spiffy_b{budget}`` / ``specfold_b{budget}``; with one budget they keep their plain names.
    ``cuda_graphs``: None (launched calls), "cuda" or "eager" (``VerifyGraphs``' replay): one
    ``VerifyGraphs`` per target, kept from the warm-up (which captures) through the timed runs.
    """
    from .tasks import sample  # noqa: PLC0415

    budgets = list(draft_budgets)
    variants: list[tuple[str, str, int]] = []  # (name, mode, budget)
    for mode in modes:
        if mode == "vanilla":
            variants.append(("vanilla", mode, 0))
        else:
            for b in budgets:
                variants.append((mode if len(budgets) == 1 else f"{mode}_b{b}", mode, b))

    compiled = compiled_model(model, tau, kernels, fold_head) if "specfold" in modes else None
    targets = {"vanilla": model, "spiffy": model, "specfold": compiled}
    # fold_head gates the head on every row: it cannot act on the masked rows alone (logit_positions)
    all_logits = {"vanilla": False, "spiffy": False, "specfold": fold_head}
    shared = graphs_for_cli(cuda_graphs, model, device)  # vanilla and Spiffy call the same eager model
    graphs = {"vanilla": shared, "spiffy": shared,
              "specfold": graphs_for_cli(cuda_graphs, compiled, device) if compiled is not None else None}
    warm: dict[str, float] = {}
    graphs_before = _unique_graphs()
    for name, mode, b in variants:
        gen_mode = "vanilla" if mode == "vanilla" else "spiffy"
        if progress:
            print(f"warm-up {name} ...", file=sys.stderr)
        warm[name] = warm_up(model, targets[mode], gen_mode, max_new_tokens=max_new_tokens, threshold=threshold,
                             draft_budget=b, draft_graph=draft_graph, device=device, seed=seed,
                             all_logits=all_logits[mode], cuda_graphs=graphs[mode] or False)
    graphs_after_warmup = _unique_graphs()

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
    graphs_end = _unique_graphs()
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


def _fmt(v, spec=".3f"):
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return format(v, spec)


def format_table(results: dict) -> str:
    head = (f"{'task':<9} {'mode':<12} {'n':>4} {'accuracy':>8} {'NFE':>7} {'tokens/s':>9} {'acc/call':>8} "
            f"{'br/call':>7} {'recompute':>9}")
    lines = [head, "-" * len(head)]
    for task, per_mode in results.items():
        for mode, r in per_mode.items():
            lines.append(f"{task:<9} {mode:<12} {r['n']:>4} {_fmt(r['accuracy']):>8} {_fmt(r['nfe'], '.2f'):>7} "
                         f"{_fmt(r['tokens_per_s'], '.1f'):>9} {_fmt(r['accepted_per_call'], '.2f'):>8} "
                         f"{_fmt(r['branches_per_call'], '.2f'):>7} {_fmt(r['recompute_ratio']):>9}")
    return "\n".join(lines)


def _jsonable(obj):
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def add_model_arguments(ap) -> None:
    """``--model``, ``--draft-budget``, ``--draft-graph``, ``--max-new-tokens``, ``--threshold``, ``--kernels``,
    ``--device``, ``--seed``, ``--no-chat-template``: shared by eval and sweep, defaults from
    ``decoding.DEFAULTS``."""
    ap.add_argument("--model", default=None, help="checkpoint dir or preset (default: the shipped model)")
    ap.add_argument("--draft-budget", type=arguments.nonnegative_int, default=DEFAULTS.draft_budget)
    ap.add_argument("--draft-graph", default=None,
                    help="draft graph JSON (default: the shipped model's calibrated graph, else decoding's default)")
    ap.add_argument("--max-new-tokens", type=arguments.positive_int, default=DEFAULTS.max_new_tokens)
    ap.add_argument("--threshold", type=arguments.threshold, default=DEFAULTS.threshold)
    ap.add_argument("--kernels", default="torch", choices=("auto", "torch", "triton"))
    ap.add_argument("--device", type=arguments.device, default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-chat-template", action="store_true",
                    help="send the prompts as they are even when the checkpoint's tokenizer has a chat template")


def eval_cli(argv=None) -> int:
    """``specfold eval``: accuracy and speed of vanilla / Spiffy / SpecFold decoding on the test split."""
    from .tasks import TASKS  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="specfold eval", description=eval_cli.__doc__)
    ap.add_argument("--tasks", type=arguments.names(TASKS, "tasks"), default=list(TASKS))
    ap.add_argument("--modes", type=arguments.names(MODES, "modes"), default=list(MODES))
    ap.add_argument("--tau", type=arguments.tau, default=0.1)
    ap.add_argument("--limit", type=arguments.positive_int, default=50, help="first N test-split problems per task")
    ap.add_argument("--draft-budgets", type=arguments.nonnegative_ints, default=None,
                    help="comma-separated budgets; Spiffy/SpecFold run per budget")
    add_model_arguments(ap)
    ap.add_argument("--fold-head", action="store_true",
                    help="SpecFold also folds the final norm and LM head (options['fold_head'])")
    add_cuda_graphs_argument(ap)
    ap.add_argument("--out", default=None, help="write the JSON report here")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    _add_unsafe_run_code_argument(ap)
    a = ap.parse_args(argv)
    with arguments.reporting_user_errors(ap.prog), arguments.one_line_warnings():
        check_cuda_graphs_argument(ap, a.cuda_graphs, a.device)
        _check_code_sandbox(a.tasks, a.unsafe_run_code)
        arguments.check_model_inputs(a)
        if a.out:
            arguments.output_file(a.out, "--out")
        return _eval(a)


def _eval(a) -> int:
    tasks, modes = a.tasks, a.modes
    budgets = a.draft_budgets or [a.draft_budget]
    t0 = time.perf_counter()
    model = load_model(a.model, device=a.device, chat_template=not a.no_chat_template)
    model.eval()
    graph = resolve_draft_graph(a.model, a.draft_graph)
    rep = evaluate(model, tasks, modes, limit=a.limit, tau=a.tau, draft_budgets=budgets, draft_graph=graph,
                   max_new_tokens=a.max_new_tokens, threshold=a.threshold, seed=a.seed, device=a.device,
                   kernels=a.kernels, fold_head=a.fold_head, progress=not a.quiet, cuda_graphs=a.cuda_graphs,
                   unsafe_run_code=a.unsafe_run_code)
    report = {
        "results": rep["results"],
        "spiffy_tokens_equal_vanilla": rep["spiffy_tokens_equal_vanilla"],
        "specfold_sequences_equal_vanilla_share": rep["specfold_sequences_equal_vanilla_share"],
        "model": _model_name(model, a.model),
        "settings": {"tasks": tasks, "modes": modes, "tau": a.tau, "limit": a.limit, "split": "test",
                     "draft_budgets": budgets, "draft_graph": graph or "decoding default",
                     "max_new_tokens": a.max_new_tokens, "threshold": a.threshold, "kernels": a.kernels,
                     "fold_head": a.fold_head, "cuda_graphs": a.cuda_graphs, "device": a.device, "seed": a.seed,
                     "unsafe_run_code": a.unsafe_run_code,
                     "torch_threads": torch.get_num_threads()},
        "versions": versions(),
        "machine": MACHINE if a.device == "cpu" else a.device,
        "compile_seconds": rep["compile_seconds"],
        "warmup_seconds": rep["warmup_seconds"],
        "dynamo_graphs": rep["dynamo_graphs"],
        "eval_seconds": rep["eval_seconds"],
        "total_seconds": time.perf_counter() - t0,
    }
    print(format_table(rep["results"]))
    print(f"spiffy tokens equal vanilla: {rep['spiffy_tokens_equal_vanilla']}")
    if any(v for v in (rep["specfold_sequences_equal_vanilla_share"] or {}).values()):
        print(f"specfold sequences equal vanilla (share): {rep['specfold_sequences_equal_vanilla_share']}")
    print(f"compile/warm-up seconds: { {k: round(v, 2) for k, v in rep['warmup_seconds'].items()} }")
    if a.out:
        Path(a.out).write_text(json.dumps(_jsonable(report), indent=2) + "\n")
        print(f"wrote {a.out}", file=sys.stderr)
    ok = all(v is not False for v in rep["spiffy_tokens_equal_vanilla"].values())
    if not ok:
        print("ERROR: Spiffy tokens differ from vanilla (lossless speculation violated)", file=sys.stderr)
    return 0 if ok else 1


# ----------------------------------------------------------------------------------------------------
# draft fidelity


def fidelity_positions(folded: torch.Tensor, dense: torch.Tensor, tokens: torch.Tensor, parents, mask_id: int
                       ) -> dict[str, torch.Tensor]:
    """Per still-masked draft position (``tokens[n, i] == mask_id``, ``n >= 1``): whether argmax of the
    folded logits equals argmax of the dense ones, their relative error ``||folded - dense|| / ||dense||``,
    and the same two numbers for the copy baseline (the parent row's dense logits at that position).

    ``folded``/``dense``: ``[N, B, V]``; ``tokens``: ``[N, B]``; ``parents``: ``[N]`` (``parents[0] = -1``).
    Returns 1-D tensors ``fold_agree``, ``fold_relerr``, ``copy_agree``, ``copy_relerr`` (float32, one entry
    per position, rows in order).
    """
    tokens = torch.as_tensor(tokens).cpu()
    parents = torch.as_tensor(parents, dtype=torch.int64).cpu()
    folded = folded.detach().float().cpu()
    dense = dense.detach().float().cpu()
    if folded.shape != dense.shape or folded.shape[:2] != tokens.shape:
        raise ValueError(f"shapes: folded {tuple(folded.shape)}, dense {tuple(dense.shape)}, tokens {tuple(tokens.shape)}")
    sel = tokens == mask_id
    sel[0] = False
    n_idx, i_idx = sel.nonzero(as_tuple=True)
    d = dense[n_idx, i_idx]            # [P, V]
    f = folded[n_idx, i_idx]
    c = dense[parents[n_idx], i_idx]   # the parent's dense logits at the same position
    norm = d.norm(dim=-1)
    darg = d.argmax(-1)
    return {
        "fold_agree": (f.argmax(-1) == darg).float(),
        "fold_relerr": (f - d).norm(dim=-1) / norm,
        "copy_agree": (c.argmax(-1) == darg).float(),
        "copy_relerr": (c - d).norm(dim=-1) / norm,
    }


def summarize_fidelity(parts: dict[str, list[torch.Tensor]] | dict[str, torch.Tensor]) -> dict:
    """Aggregate ``fidelity_positions`` outputs: argmax agreement share and relative error median / p99."""
    cat = {k: (torch.cat(v) if isinstance(v, list) and v else (v if isinstance(v, torch.Tensor) else torch.empty(0)))
           for k, v in parts.items()}
    n = int(cat["fold_agree"].numel()) if "fold_agree" in cat else 0
    out: dict = {"positions": n}
    for which in ("fold", "copy"):
        agree, err = cat.get(f"{which}_agree"), cat.get(f"{which}_relerr")
        if n == 0:
            out.update({f"{which}_argmax_agree": float("nan"), f"{which}_relerr_median": float("nan"),
                        f"{which}_relerr_p99": float("nan")})
            continue
        err = err.double()
        out[f"{which}_argmax_agree"] = float(agree.double().mean())
        out[f"{which}_relerr_median"] = float(torch.quantile(err, 0.5))
        out[f"{which}_relerr_p99"] = float(torch.quantile(err, 0.99))
    return out


class FidelityRecorder:
    """A thin stand-in for the eager model in Spiffy decoding. ``__call__`` returns the dense logits (so
    decoding is unchanged and lossless) and, for every ``every``-th call with more than one branch,
    evaluates ``folded_verify`` at each ``tau`` and accumulates ``fidelity_positions``."""

    def __init__(self, model, taus, every: int = 1) -> None:
        self.model = model
        self.taus = [float(t) for t in taus]
        self.every = max(1, int(every))
        self.parts = {t: {k: [] for k in ("fold_agree", "fold_relerr", "copy_agree", "copy_relerr")}
                      for t in self.taus}
        self.multi_calls = 0
        self.measured_calls = 0
        self.seconds = 0.0

    @property
    def config(self):
        return self.model.config

    def prefill(self, *args, **kwargs):
        return self.model.prefill(*args, **kwargs)

    def write_block(self, *args, **kwargs):
        return self.model.write_block(*args, **kwargs)

    def __getattr__(self, name):  # anything else the decoder might read
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)

    def __call__(self, tokens, parents, cache, logit_positions=None):
        from .reference import folded_verify  # noqa: PLC0415

        dense = self.model(tokens, parents, cache)
        if tokens.shape[0] > 1:
            self.multi_calls += 1
            if (self.multi_calls - 1) % self.every == 0:
                t0 = time.perf_counter()
                self.measured_calls += 1
                mask_id = int(self.model.config.mask_token_id)
                for tau in self.taus:
                    folded, _ = folded_verify(self.model, tokens, parents, cache, tau)
                    for k, v in fidelity_positions(folded, dense, tokens, parents, mask_id).items():
                        self.parts[tau][k].append(v)
                self.seconds += time.perf_counter() - t0
        return dense if logit_positions is None else dense.flatten(0, 1)[logit_positions]

    def summary(self) -> dict[float, dict]:
        return {t: summarize_fidelity(p) for t, p in self.parts.items()}


# ----------------------------------------------------------------------------------------------------
# sweep

SWEEP_FIDELITY_COLUMNS = ("fold_argmax_agree", "fold_relerr_median", "fold_relerr_p99",
                          "copy_argmax_agree", "copy_relerr_median", "copy_relerr_p99", "fidelity_positions")


def sweep_columns(tasks) -> list[str]:
    return (["tau"] + [f"accuracy_{t}" for t in tasks]
            + ["tokens_per_s", "recompute_ratio", "nfe", "accepted_per_call", "n_per_task"]
            + list(SWEEP_FIDELITY_COLUMNS))


def sweep(model, taus, tasks, *, limit: int, draft_budget: int = DEFAULTS.draft_budget, draft_graph=None,
          max_new_tokens: int = DEFAULTS.max_new_tokens, threshold: float = DEFAULTS.threshold, seed: int = 0,
          device: str = "cpu", kernels: str = "torch", fidelity_every: int = 1, progress: bool = True,
          unsafe_run_code: bool = False) -> dict:
    """Per tau: SpecFold decoding (accuracy per task, tokens/s, recompute ratio); and fidelity of the
    folded logits at still-masked draft positions vs dense, measured on the calls of Spiffy decoding."""
    import torch._dynamo  # noqa: PLC0415

    from .tasks import sample  # noqa: PLC0415

    problems = {t: sample(t, "test", limit, seed) for t in tasks}
    kw = dict(max_new_tokens=max_new_tokens, threshold=threshold, draft_budget=draft_budget,
              draft_graph=draft_graph, device=device)

    # 1. fidelity: Spiffy decoding through the recorder (dense logits drive decoding, folded ones are scored)
    rec = FidelityRecorder(model, taus, every=fidelity_every)
    spiffy_acc = {}
    for t in tasks:
        run = decode_problems(model, rec, "spiffy", problems[t], progress=f"fidelity {t}" if progress else None,
                              unsafe_run_code=unsafe_run_code, **kw)
        spiffy_acc[t] = run.summary()["accuracy"]
    fid = rec.summary()

    # 2. SpecFold decoding per tau
    rows = []
    timing = {}
    for tau in taus:
        torch._dynamo.reset()
        compiled = compiled_model(model, tau, kernels)
        timing[tau] = warm_up(model, compiled, "spiffy", seed=seed, **kw)
        acc, toks, wall, nfe, n, calls, accepted = {}, 0, 0.0, 0, 0, 0, 0
        ratio_num = ratio_den = 0.0
        for t in tasks:
            run = decode_problems(model, compiled, "spiffy", problems[t], stats=True,
                                  progress=f"tau={tau} {t}" if progress else None,
                                  unsafe_run_code=unsafe_run_code, **kw)
            s = run.summary()
            acc[t] = s["accuracy"]
            toks += run.gen_tokens
            wall += run.wall
            nfe += run.nfe
            n += len(run.tokens)
            calls += run.calls
            accepted += run.accepted
            if run.recompute_ratio is not None:
                # weight by draft rows ~ (branches - calls); good enough to pool tasks
                w = max(run.branches - run.calls, 0)
                ratio_num += run.recompute_ratio * w
                ratio_den += w
        row = {"tau": tau, **{f"accuracy_{t}": acc[t] for t in tasks},
               "tokens_per_s": toks / wall if wall > 0 else float("nan"),
               "recompute_ratio": ratio_num / ratio_den if ratio_den else float("nan"),
               "nfe": nfe / n if n else float("nan"),
               "accepted_per_call": accepted / calls if calls else 0.0,
               "n_per_task": limit}
        f = fid[float(tau)]
        row.update({k: f[k] for k in SWEEP_FIDELITY_COLUMNS if k != "fidelity_positions"})
        row["fidelity_positions"] = f["positions"]
        rows.append(row)
    return {"rows": rows, "spiffy_accuracy": spiffy_acc, "warmup_seconds": timing,
            "fidelity_calls": {"multi_branch_calls": rec.multi_calls, "measured_calls": rec.measured_calls,
                               "seconds": rec.seconds}}


def write_sweep_csv(rows, tasks, path) -> None:
    cols = sweep_columns(tasks)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in cols})


def plot_sweep(rows, tasks, path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    taus = [r["tau"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    for k, t in enumerate(tasks):  # distinct markers/styles: tasks often overlap at 1.0
        ax.plot(taus, [r[f"accuracy_{t}"] for r in rows], marker="osD^v"[k % 5], linestyle=("-", "--", ":")[k % 3],
                markersize=8 - 2 * (k % 3), label=t)
    ax.set_xlabel("tau")
    ax.set_ylabel("accuracy (SpecFold decoding)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("accuracy per task")
    ax.legend()
    ax = axes[1]
    ax.plot(taus, [r["tokens_per_s"] for r in rows], "o-", color="C0", label="tokens/s")
    ax.set_xlabel("tau")
    ax.set_ylabel("tokens/s", color="C0")
    ax2 = ax.twinx()
    ax2.plot(taus, [r["recompute_ratio"] for r in rows], "s--", color="C3", label="recompute ratio")
    ax2.set_ylabel("recompute ratio (computed / all draft rows)", color="C3")
    ax2.set_ylim(-0.02, 1.02)
    ax.set_title("speed and recompute ratio")
    ax = axes[2]
    ax.plot(taus, [r["fold_relerr_median"] for r in rows], "o-", color="C0", label="fold: rel. err median")
    ax.plot(taus, [r["fold_relerr_p99"] for r in rows], "o:", color="C0", label="fold: rel. err p99")
    ax.plot(taus, [r["copy_relerr_median"] for r in rows], "-", color="C1", label="copy parent: median")
    ax.plot(taus, [r["copy_relerr_p99"] for r in rows], ":", color="C1", label="copy parent: p99")
    ax.set_xlabel("tau")
    ax.set_ylabel("||logits - dense|| / ||dense||")
    ax3 = ax.twinx()
    ax3.plot(taus, [r["fold_argmax_agree"] for r in rows], "^-", color="C2", label="fold: argmax agree")
    ax3.plot(taus, [r["copy_argmax_agree"] for r in rows], "-", color="C4", label="copy: argmax agree")
    ax3.set_ylabel("argmax agreement with dense")
    ax3.set_ylim(-0.02, 1.02)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax3.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="center right")
    ax.set_title("draft fidelity at still-masked positions")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_sweep_table(rows, tasks) -> str:
    head = (f"{'tau':>5} " + " ".join(f"{'acc_' + t:>12}" for t in tasks)
            + f" {'tok/s':>7} {'recomp':>6} {'fold_agree':>10} {'fold_med':>8} {'fold_p99':>8}"
            f" {'copy_agree':>10} {'copy_med':>8} {'copy_p99':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['tau']:>5} " + " ".join(f"{_fmt(r['accuracy_' + t]):>12}" for t in tasks)
                     + f" {_fmt(r['tokens_per_s'], '.1f'):>7} {_fmt(r['recompute_ratio']):>6}"
                     f" {_fmt(r['fold_argmax_agree']):>10} {_fmt(r['fold_relerr_median'], '.4f'):>8}"
                     f" {_fmt(r['fold_relerr_p99'], '.4f'):>8} {_fmt(r['copy_argmax_agree']):>10}"
                     f" {_fmt(r['copy_relerr_median'], '.4f'):>8} {_fmt(r['copy_relerr_p99'], '.4f'):>8}")
    return "\n".join(lines)


def sweep_cli(argv=None) -> int:
    """``specfold sweep``: SpecFold accuracy, speed, recompute ratio and draft fidelity against tau.
    Writes sweep.csv, sweep.json and (unless ``--no-plot``; needs matplotlib) sweep.png to ``--out-dir``."""
    from .tasks import TASKS  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="specfold sweep", description=sweep_cli.__doc__)
    ap.add_argument("--taus", type=arguments.taus, default=[0.0, 0.02, 0.05, 0.1, 0.2, 0.4])
    ap.add_argument("--tasks", type=arguments.names(TASKS, "tasks"), default=list(TASKS))
    ap.add_argument("--limit", type=arguments.positive_int, default=30)
    add_model_arguments(ap)
    ap.add_argument("--fidelity-every", type=arguments.positive_int, default=1,
                    help="measure fidelity on every k-th multi-branch call")
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--no-plot", action="store_true", help="skip sweep.png (which needs matplotlib)")
    ap.add_argument("--quiet", action="store_true")
    _add_unsafe_run_code_argument(ap)
    a = ap.parse_args(argv)
    with arguments.reporting_user_errors(ap.prog), arguments.one_line_warnings():
        if not a.no_plot:
            arguments.require_module("matplotlib", "sweep.png", "plot", "pass --no-plot")
        _check_code_sandbox(a.tasks, a.unsafe_run_code)
        arguments.check_model_inputs(a)
        arguments.output_dir(a.out_dir, "--out-dir")
        return _sweep(a)


def _sweep(a) -> int:
    taus, tasks = a.taus, a.tasks
    t0 = time.perf_counter()
    model = load_model(a.model, device=a.device, chat_template=not a.no_chat_template)
    model.eval()
    graph = resolve_draft_graph(a.model, a.draft_graph)
    rep = sweep(model, taus, tasks, limit=a.limit, draft_budget=a.draft_budget, draft_graph=graph,
                max_new_tokens=a.max_new_tokens, threshold=a.threshold, seed=a.seed, device=a.device,
                kernels=a.kernels, fidelity_every=a.fidelity_every, progress=not a.quiet,
                unsafe_run_code=a.unsafe_run_code)
    out = Path(a.out_dir)
    meta = {"rows": rep["rows"], "spiffy_accuracy": rep["spiffy_accuracy"], "warmup_seconds": rep["warmup_seconds"],
            "fidelity_calls": rep["fidelity_calls"], "model": _model_name(model, a.model),
            "settings": {"taus": taus, "tasks": tasks, "limit": a.limit, "split": "test",
                         "draft_budget": a.draft_budget, "draft_graph": graph or "decoding default",
                         "max_new_tokens": a.max_new_tokens, "threshold": a.threshold, "kernels": a.kernels,
                         "fidelity_every": a.fidelity_every, "seed": a.seed, "unsafe_run_code": a.unsafe_run_code,
                         "fidelity_positions": "draft rows n>=1, token == mask id; copy = parent's dense logits"},
            "versions": versions(), "machine": MACHINE if a.device == "cpu" else a.device,
            "total_seconds": time.perf_counter() - t0}
    # The measurements first: a failing plot loses nothing.
    written = [out / "sweep.csv", out / "sweep.json"]
    write_sweep_csv(rep["rows"], tasks, written[0])
    written[1].write_text(json.dumps(_jsonable(meta), indent=2) + "\n")
    if not a.no_plot:
        plot_sweep(rep["rows"], tasks, out / "sweep.png")
        written.append(out / "sweep.png")
    print(format_sweep_table(rep["rows"], tasks))
    print(f"wrote {', '.join(map(str, written))}", file=sys.stderr)
    return 0


# ----------------------------------------------------------------------------------------------------
# calibration of the shipped model's draft graph


def calibrate_default(model=None, *, n: int = 50, size: int = 16, seed: int = 0, max_new_tokens: int = 96,
                      threshold: float = 0.9, out: str | Path | None = DEFAULT_DRAFT_GRAPH) -> dict:
    """Record vanilla traces on ``n`` calib-split problems spread over the three tasks, calibrate a draft
    graph of ``size`` nodes and (``out``) save it. Returns the graph dict (plus ``"calibration"`` info)."""
    from .decoding import calibrate, record_traces, save_draft_graph  # noqa: PLC0415
    from .tasks import TASKS, sample  # noqa: PLC0415

    if model is None:
        model = load_model(None)
    per = [n // len(TASKS) + (1 if i < n % len(TASKS) else 0) for i in range(len(TASKS))]
    problems = [p for t, k in zip(TASKS, per) for p in sample(t, "calib", k, seed)]
    prompts = [encode(model, p.prompt) for p in problems]
    traces = record_traces(model, prompts, max_new_tokens=max_new_tokens, threshold=threshold)
    graph = calibrate(traces, size=size)
    if out is not None:
        save_draft_graph(graph, out)
    steps = sum(len(b["conf"]) for b in traces["blocks"])
    info = {"prompts": len(prompts), "per_task": dict(zip(TASKS, per)), "split": "calib",
            "blocks": len(traces["blocks"]), "steps": steps, "size": size}
    return {**graph, "calibration": info}


if __name__ == "__main__":  # pragma: no cover
    sys.exit(eval_cli(sys.argv[1:]))
