"""The ``tau`` sweep: per fold threshold, SpecFold's accuracy per task, tokens/s and recompute ratio, and
the fidelity of the folded logits (measured on Spiffy's calls, whose dense logits drive the decoding)."""

from __future__ import annotations

import csv

from ..decoding.defaults import DEFAULTS
from .fidelity import FidelityRecorder
from .run import compiled_model, decode_problems, warm_up

SWEEP_FIDELITY_COLUMNS = ("fold_argmax_agree", "fold_relerr_median", "fold_relerr_p99",
                          "copy_argmax_agree", "copy_relerr_median", "copy_relerr_p99", "fidelity_positions")


def sweep_columns(tasks) -> list[str]:
    return (["tau"] + [f"accuracy_{t}" for t in tasks]
            + ["tokens_per_s", "recompute_ratio", "nfe", "accepted_per_call", "n_per_task"]
            + list(SWEEP_FIDELITY_COLUMNS))


def sweep(model, taus, tasks, *, limit: int, draft_budget: int = DEFAULTS.draft_budget, draft_graph=None,
          max_new_tokens: int = DEFAULTS.max_new_tokens, threshold: float = DEFAULTS.threshold, seed: int = 0,
          device: str = "cpu", kernels: str = "auto", fidelity_every: int = 1, progress: bool = True,
          unsafe_run_code: bool = False) -> dict:
    """Per tau: SpecFold decoding (accuracy per task, tokens/s, recompute ratio); and fidelity of the
    folded logits at still-masked draft positions vs dense, measured on the calls of Spiffy decoding."""
    import torch._dynamo  # noqa: PLC0415

    from ..tasks import sample  # noqa: PLC0415

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

