"""``specfold demo``: vanilla vs Spiffy vs SpecFold decoding of one held-out problem per task.

On a CPU it shows what holds on any device: Spiffy decodes exactly vanilla's tokens (lossless) in fewer
forwards, and SpecFold recomputes only part of the draft rows (the recompute ratio). The speed-up needs
a GPU, so the committed GPU results (``eval.headline``, with their hardware and versions) are printed
next to its own numbers; on CUDA the table is measured on that GPU. Every block of text it prints says
what it is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..eval.headline import gpu_headline
from ..eval.report import model_name
from ..loading import decode, encode, load_model
from .generate import compiled, run_mode

MODES = ("vanilla", "spiffy", "specfold")
SHOWN_CHARS = 300


def demo_prompts() -> list[str]:
    """The first held-out test problem of each task, in ``tasks.TASKS`` order (what the shipped model was
    trained for)."""
    from ..tasks import TASKS, sample  # noqa: PLC0415

    return [sample(task, "test", 1, 0)[0].prompt for task in TASKS]


@dataclass
class ModeRun:
    """One mode over every prompt: the timed (second) pass, and the seconds of the first."""

    mode: str
    first_pass_s: float
    outputs: list[list[int]] = field(default_factory=list)
    nfe: int = 0
    calls: int = 0
    accepted: int = 0
    wall_s: float = 0.0
    computed_rows: int = 0
    draft_rows: int = 0

    @property
    def tokens(self) -> int:
        return sum(map(len, self.outputs))

    @property
    def recompute_ratio(self) -> float | None:
        return self.computed_rows / self.draft_rows if self.draft_rows else None


def measure(model, prompt_ids, mode: str, args, specfold_model, graphs) -> ModeRun:
    """A first pass over the prompts compiles every shape (SpecFold) and captures graphs
    (``--cuda-graphs``); the second pass is the one measured."""
    from ..backend import collect_stats  # noqa: PLC0415

    t0 = time.perf_counter()
    for ids in prompt_ids:
        run_mode(model, ids, mode, args, specfold_model, graphs)
    run = ModeRun(mode, time.perf_counter() - t0)
    for ids in prompt_ids:
        with collect_stats() as s:
            res = run_mode(model, ids, mode, args, specfold_model, graphs)
        run.outputs.append(list(res.tokens))
        run.nfe += res.nfe
        run.calls += res.num_calls
        run.accepted += sum(st.accepted for st in res.steps)
        run.wall_s += res.wall_time_s
        if mode == "specfold":
            run.computed_rows += sum(layer.computed_draft_rows for layer in s.layers)
            run.draft_rows += sum(layer.draft_rows for layer in s.layers)
    return run


def where(device: str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"{dev.type.upper()} ({torch.get_num_threads()} torch threads)"


def table(runs: list[ModeRun], device_name: str) -> list[str]:
    head = (f"{'mode':<9} {'tokens':>6} {'NFE':>5} {'tokens/s':>9} {'accepted/call':>14} {'recompute':>9} "
            f"{'first pass s':>12}")
    lines = [f"[measured here, on {device_name}; tokens/s and seconds from the second pass]", head]
    for r in runs:
        ratio = "-" if r.recompute_ratio is None else f"{r.recompute_ratio:.2f}"
        lines.append(f"{r.mode:<9} {r.tokens:>6} {r.nfe:>5} {r.tokens / max(r.wall_s, 1e-9):>9.1f} "
                     f"{r.accepted / max(r.calls, 1):>14.2f} {ratio:>9} {r.first_pass_s:>12.2f}")
    return lines


def findings(runs: dict[str, ModeRun], tau: float) -> list[str]:
    vanilla, spiffy, specfold = runs["vanilla"], runs["spiffy"], runs["specfold"]
    same = sum(a == b for a, b in zip(spiffy.outputs, vanilla.outputs))
    folded_same = sum(a == b for a, b in zip(specfold.outputs, vanilla.outputs))
    n = len(vanilla.outputs)
    ratio = specfold.recompute_ratio
    return [
        "[what this run shows]",
        f"lossless: Spiffy's tokens identical to vanilla's: {same == n} ({same}/{n} prompts)",
        f"fewer forwards: vanilla {vanilla.nfe} NFE, Spiffy {spiffy.nfe}, SpecFold {specfold.nfe}",
        "recompute ratio: SpecFold recomputed " + (f"{ratio:.2f} of the draft rows (tau = {tau:g}); the rest "
                                                   "reused their parent's work" if ratio is not None else
                                                   "no draft rows (no call folded)"),
        f"SpecFold's tokens identical to vanilla's on {folded_same}/{n} prompts (tau > 0 approximates the "
        "draft rows' logits; the main row is exact, docs/SPEC.md P2)",
    ]


def gpu_lines(device: str, results_dir, model_label: str, replay: str | None = None) -> list[str]:
    on_gpu = torch.device(device).type == "cuda"
    calls = ("calls replayed from CUDA graphs" if replay == "cuda" else
             "launched calls (--cuda-graphs replays them, as the committed per-call numbers were measured)")
    lines = ["[the speed-up]"]
    lines.append(f"measured above, on this GPU, with {model_label}, {calls}" if on_gpu else
                 "not shown on a CPU: the speed-up needs a GPU (run `specfold demo --device cuda`, or see the "
                 "committed GPU results below); the CPU tokens/s above are no measure of it")
    headline = gpu_headline(results_dir)
    if headline.missing:
        lines.append(f"[committed GPU results] {headline.missing}")
    else:
        lines.append(f"[committed GPU results: {headline.hardware}]")
        lines.extend(f"  {line}" for line in headline.lines)
    return lines


def shown(text: str) -> tuple[str, str]:
    """The text as printed, and a note when it was cut."""
    return (text, "") if len(text) <= SHOWN_CHARS else (text[:SHOWN_CHARS], f", first {SHOWN_CHARS} characters")


def texts(model, prompts, runs: dict[str, ModeRun]) -> list[str]:
    lines = []
    for k, (task, prompt) in enumerate(prompts):
        lines += ["" if k else "[the texts]", f"--- {task}: prompt ---", prompt]
        vanilla = runs["vanilla"].outputs[k]
        same = [m for m in ("spiffy", "specfold") if runs[m].outputs[k] == vanilla]
        for mode in ["vanilla"] + [m for m in ("spiffy", "specfold") if m not in same]:
            text, cut = shown(decode(model, runs[mode].outputs[k]))
            also = f"; {' and '.join(same)}: identical" if mode == "vanilla" and same else ""
            lines += [f"--- {task}: {mode} output{also}{cut} ---", text]
    return lines


def cmd_demo(args) -> int:
    model = load_model(args.model, device=args.device, chat_template=not args.no_chat_template)
    specfold_model = compiled(model, args.tau)
    device_name = where(args.device)
    params = sum(p.numel() for p in model.parameters())
    model_label = f"{model_name(model, args.model)} ({params / 1e6:.1f}M parameters)"
    print(f"model: {model_label}")
    print(f"device: {device_name}")
    from ..tasks import TASKS  # noqa: PLC0415

    prompts = list(zip(TASKS, demo_prompts()))
    prompt_ids = [encode(model, prompt).to(args.device) for _, prompt in prompts]
    graphs: dict = {}  # --cuda-graphs: one VerifyGraphs per target, captured in the first pass
    runs = {mode: measure(model, prompt_ids, mode, args, specfold_model, graphs) for mode in MODES}
    for block in (table(list(runs.values()), device_name), findings(runs, args.tau),
                  gpu_lines(args.device, args.gpu_results, model_label, args.cuda_graphs),
                  texts(model, prompts, runs)):
        print()
        print("\n".join(block))
    return 0 if runs["spiffy"].outputs == runs["vanilla"].outputs else 1
