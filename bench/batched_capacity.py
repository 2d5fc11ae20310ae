"""bench.batched's SpecFold graph capacities: the ``--fold-capacity``, ``--min-packed``,
``--capacity-spread``, ``--gate-kernel`` and ``--packed-attention`` arguments (``serving.graphs.BatchGraphs``'
``fold_capacity``, ``min_packed``, ``capacity_spread``, ``gate_kernel`` and ``packed_attention``), and each
``--fold-capacity`` value's shares."""

from __future__ import annotations


def add_capacity_arguments(ap) -> None:
    """The five arguments, on ``bench.batched``'s parser."""
    ap.add_argument("--fold-capacity", default="0.5",
                    help="replay with --cuda-graphs on, SpecFold: the share of draft positions a graph's gate packs, "
                         "comma-separated values each a number in (0, 1] or 'record' / 'record:MARGIN' (a share a "
                         "gate from the record's fold masks, serving.graphs.capacity_from_masks: each gate's mean "
                         "share, times MARGIN if given); each value its own rows")
    ap.add_argument("--min-packed", type=int, default=None,
                    help="replay with --cuda-graphs on, SpecFold: positions a gate packs at least (default: "
                         "serving.graphs.MIN_PACKED)")
    ap.add_argument("--capacity-spread", type=float, default=None,
                    help="replay with --cuda-graphs on, SpecFold: a graph packs its gates' shares times 1 + SPREAD / "
                         "sqrt(draft rows) (default: serving.graphs.CAPACITY_SPREAD)")
    ap.add_argument("--gate-kernel", choices=("auto", "off"), default="auto",
                    help="replay with --cuda-graphs on, SpecFold: how the gates resolve and pack; auto: the Triton "
                         "kernel wherever Triton runs, off: tensor ops (BatchGraphs(gate_kernel=False))")
    ap.add_argument("--packed-attention", choices=("off", "on"), default="off",
                    help="replay with --cuda-graphs on, SpecFold: on: the attention reads the packed rows, each "
                         "computed position's prefix walked once (BatchGraphs(packed_attention=True)); off: every "
                         "position's q, k, v")


def parse_capacity_arguments(ap, args) -> None:
    """``--fold-capacity`` split and checked (a one-line error otherwise), the defaults filled in."""
    from specfold_compile.serving.graphs import CAPACITY_SPREAD, MIN_PACKED, check_fold_capacity

    args.fold_capacity = tuple(args.fold_capacity.split(","))
    try:
        for value in args.fold_capacity:
            if value.startswith("record:"):
                if not float(value.removeprefix("record:")) > 0:
                    raise ValueError(value)
            elif value != "record":
                check_fold_capacity(float(value))
    except ValueError:
        ap.error(f"--fold-capacity: expected numbers in (0, 1], 'record' or 'record:MARGIN' (MARGIN > 0), "
                 f"comma-separated, got {value!r}")
    args.min_packed = MIN_PACKED if args.min_packed is None else args.min_packed
    args.capacity_spread = CAPACITY_SPREAD if args.capacity_spread is None else args.capacity_spread


def fold_capacity(label: str, recorded: list[dict], gates: int) -> tuple[str, float | tuple[float, ...]]:
    """``--fold-capacity``'s value ``label``: a number, or ``record`` (``record:MARGIN``): a share a gate
    from the record's fold masks as the replay forces them (``serving.graphs.capacity_from_masks``: each
    gate's mean share, times ``MARGIN`` when given)."""
    if not label.startswith("record"):
        return label, float(label)
    from specfold_compile.decoding.step_forcing import recorded_gates
    from specfold_compile.serving.graphs import capacity_from_masks

    margin = {"margin": float(label.removeprefix("record:"))} if ":" in label else {}
    masks = [c["fold_masks"] for r in recorded for c in r["forced"]["calls"]
             if c.get("fold_masks") is not None and c["fold_masks"].shape[1] > 1]
    if not masks:  # no call with drafts (a record under a row limit): no folded forward to size
        return label, 1.0
    return label, capacity_from_masks((m[recorded_gates(m.shape[0], gates)] for m in masks), **margin)
