"""The sweep's figure (needs matplotlib: ``specfold-compile[plot]``)."""

from __future__ import annotations


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
