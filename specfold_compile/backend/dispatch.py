"""Which calls to fold: the fold-or-plain decision by branch count N, and the callable that applies it.

Folding saves the rows it does not compute and costs a fixed set of launches per layer (gate, origin
resolution, packing, spills). With few branches every row of a linear reads the same weights, so the
linears are bandwidth-bound and skipping rows saves nothing: the launches are pure overhead (H200,
session 4: SpecFold 1.02-1.11x dense under Inductor at N = 5). So the backend decides per call, on the
host, from N alone (no device value is read): ``FoldPlan.fold_at(n)``. When some branch counts fold
and others do not, the plain graph is compiled alongside the folded one and ``FoldDispatch`` picks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.fx import GraphModule, Node

from .. import fold_ops
from ..passes import ops_table as T
from ..passes.analyze import Analysis
from ..passes.lower_kernels import resolve_impl
from . import stats

# Dynamic-N graphs: which variants to compile is decided over N = 2..MAX_PLANNED_BRANCHES (beyond it,
# a call runs whichever variant exists when its own decision's variant was not compiled).
MAX_PLANNED_BRANCHES = 128


@dataclass
class FoldPlan:
    fold_at: Callable[[int], bool]  # N -> fold this call?
    variants: str  # "folded" | "plain" | "both": what the backend compiles
    n_input: int | None = None  # index of the graph input that carries N (needed for "both")
    n_is_dim: bool = True  # that input's shape[0] is N (else the input is N itself, a SymInt)
    description: str = ""
    decisions: dict[int, bool] = field(default_factory=dict)
    traced: GraphModule | None = None  # with "both": the graph before the rewrite, for the plain calls

    def branches(self, args: tuple[Any, ...]) -> int:
        a = args[self.n_input]
        return int(a.shape[0]) if self.n_is_dim else int(a)


def _weight_shapes(analysis: Analysis) -> tuple[list[tuple[int, int]], int]:
    """(out, in) of every linear that folding packs, and the weights' element size (from the traced
    example values; a weight without one is left out, which only makes folding look less worth it)."""
    shapes, itemsize = [], 2
    regions = list(analysis.layers) + ([analysis.head] if analysis.head is not None else [])
    for region in regions:
        nodes = region.nodes if hasattr(region, "nodes") else region.pre_attention + region.mlp
        for node in nodes:
            if node.target not in T.LINEAR_FUNCTIONS:
                continue
            w = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
            value = w.meta.get("example_value", w.meta.get("val")) if isinstance(w, Node) else None
            if isinstance(value, torch.Tensor) and value.dim() == 2 and all(type(s) is int for s in value.shape):
                shapes.append((value.shape[0], value.shape[1]))
                itemsize = value.element_size()
    return shapes, itemsize


def _n_input(gm: GraphModule, n: Any) -> tuple[int | None, bool]:
    """The graph input whose runtime value gives the symbolic branch count ``n``."""
    placeholders = [p for p in gm.graph.nodes if p.op == "placeholder"]
    expr = n.node.expr
    for i, p in enumerate(placeholders):
        v = p.meta.get("example_value", p.meta.get("val"))
        if isinstance(v, torch.Tensor) and v.dim() > 0 and isinstance(v.shape[0], torch.SymInt) \
                and v.shape[0].node.expr == expr:
            return i, True
    for i, p in enumerate(placeholders):
        v = p.meta.get("example_value", p.meta.get("val"))
        if isinstance(v, torch.SymInt) and v.node.expr == expr:
            return i, False
    return None, True


def _cost_model_applies(impl: str, device_type: str) -> bool:
    """The estimate is of cuBLAS and our Triton kernels on the GPU; elsewhere every call folds."""
    return impl == "triton" and device_type == "cuda"


def cost_model_folds(n: int, block: int, weight_shapes: list[tuple[int, int]], regions: int, settings: Any,
                     itemsize: int = 2) -> bool:
    """The cost model's decision for a call of ``n`` branches of ``block`` positions, whose gated
    ``regions`` pack linears of ``weight_shapes`` ((out, in), all regions together)."""
    if n < 2:
        return False
    saving = fold_ops.fold_saving_us(n * block, weight_shapes, settings.dense_fraction, settings.min_spill_us,
                                     itemsize)
    return saving > fold_ops.FOLD_OVERHEAD_US * regions


def fold_plan(gm: GraphModule, settings: Any) -> FoldPlan:
    """The fold decision of a foldable graph (after ``find_regions``), from ``settings.fold_min_branches``."""
    analysis: Analysis = gm.meta["specfold"]
    marker_value = analysis.marker.meta["example_value"]
    n, block = marker_value.shape[0], marker_value.shape[1]
    k = settings.fold_min_branches
    impl = resolve_impl(settings.kernels, marker_value.device.type)
    if k is not None:
        fold_at = lambda b: b >= k  # noqa: E731
        why = f"fold_min_branches={k}: fold calls with N >= {k}"
    elif _cost_model_applies(impl, marker_value.device.type) and type(block) is int:
        shapes, itemsize = _weight_shapes(analysis)
        regions = len(analysis.layers) + (analysis.head is not None)
        memo: dict[int, bool] = {}

        def fold_at(b: int) -> bool:
            if b not in memo:
                memo[b] = cost_model_folds(b, block, shapes, regions, settings, itemsize)
            return memo[b]
        why = (f"cost model: fold a call when its {len(shapes)} linears are estimated to save more than "
               f"{fold_ops.FOLD_OVERHEAD_US:g} us x {regions} gated regions")
    else:
        fold_at = lambda b: b >= 2  # noqa: E731
        why = f"fold every multi-branch call (no cost model for kernels={impl} on {marker_value.device.type})"
    if type(n) is int:
        folds = fold_at(n)
        return FoldPlan(fold_at, "folded" if folds else "plain", description=(
            f"{why}; N = {n} (static): {'folded' if folds else 'not folded, the plain graph runs'}"),
            decisions={n: folds})
    decisions = {b: fold_at(b) for b in range(2, MAX_PLANNED_BRANCHES + 1)}
    folded = sorted(b for b, f in decisions.items() if f)
    if len(folded) == len(decisions):
        return FoldPlan(fold_at, "folded", description=f"{why}; every N folds", decisions=decisions)
    if not folded:
        return FoldPlan(fold_at, "plain", description=(
            f"{why}; no N up to {MAX_PLANNED_BRANCHES} folds: the plain graph runs"), decisions=decisions)
    index, is_dim = _n_input(gm, n)
    if index is None:
        return FoldPlan(lambda b: True, "folded", description=(
            f"{why}; but no graph input carries N, so every call folds"), decisions=decisions)
    plain = [b for b, f in decisions.items() if not f]
    return FoldPlan(fold_at, "both", index, is_dim, description=(
        f"{why}; folded from N = {folded[0]} (plain at N = {_ranges(plain)}): plain graph compiled alongside"),
        decisions=decisions)


def _ranges(values: list[int]) -> str:
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)


class FoldDispatch:
    """Runs the folded or the plain compiled graph, by the call's branch count."""

    def __init__(self, folded: Callable, plain: Callable, plan: FoldPlan) -> None:
        self.folded, self.plain, self.plan = folded, plain, plan

    def __call__(self, *args: Any) -> Any:
        if self.plan.fold_at(self.plan.branches(args)):
            return self.folded(*args)
        stats.record_plain_call()
        return self.plain(*args)
