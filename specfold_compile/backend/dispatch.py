"""Which calls to fold: the fold-or-plain decision by branch count N, and the callable that applies it.

Folding saves the rows it does not compute and costs a fixed set of launches per layer (gate, origin
resolution, packing, spills). With few branches every row of a linear reads the same weights, so the
linears are bandwidth-bound and skipping rows saves nothing: the launches are pure overhead (H200:
SpecFold 1.02-1.11x dense under Inductor at N = 5, every call folded). So the backend decides per call, on the
host, from N alone (no device value is read): ``FoldPlan.fold_at(n)``. When some branch counts fold
and others do not, the plain graph is compiled alongside the folded one and ``FoldDispatch`` picks.

The cost model counts GPU time, which is what a call costs when it is replayed from a CUDA graph.
Launched from the host instead, a call costs its host work, and a folded forward's is much larger:
on the H200's host, 507 launches and 168 custom ops, 34-58 ms a forward launched at 1.5B and 7B,
against 10-29 ms for the plain graph under Inductor (which takes 2-15 ms on the GPU): launched folded
calls were 1.8-3.3x slower than plain ones. So with the cost model (and
``Tuning.fold_launched=False``, the default) a call folds only while it is being captured into a CUDA graph;
launched, it runs the plain graph. The first launched call at each N also runs the folded graph once,
unrecorded and its result dropped, so that the folded graph's first run (autotuning, whose key
depends on N only) happens outside any capture that follows; launched results are always the plain
graph's. Captures are seen on the current stream (``torch.cuda.graph``); Inductor's CUDA-graph trees
are not used here and would look launched.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.fx import GraphModule, Node

from ..ops import fold_ops
from ..passes import ops_table as T
from ..passes.analyze import Analysis
from ..passes.lower_kernels import resolve_impl
from ..ops import stats

@dataclass
class FoldPlan:
    fold_at: Callable[[int], bool]  # N -> fold this call?
    variants: str  # "folded" | "plain" | "both": what the backend compiles
    n_input: int | None = None  # index of the graph input that carries N (needed for "both")
    n_is_dim: bool = True  # that input's shape[0] is N (else the input is N itself, a SymInt)
    description: str = ""
    decisions: dict[int, bool] = field(default_factory=dict)
    traced: GraphModule | None = None  # with "both": the graph before the rewrite, for the plain calls
    launched_plain: bool = False  # calls launched from the host (not captured) run the plain graph
    static_n: int | None = None  # N of a static-N graph (branches() without an input carrying N)

    def branches(self, args: tuple[Any, ...]) -> int | None:
        if self.n_input is None:
            return self.static_n
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
    ``regions`` pack linears of ``weight_shapes`` ((out, in), all regions together), under
    ``settings.tuning`` (its roofline and ``fold_overhead_us``)."""
    if n < 2:
        return False
    tuning = settings.tuning
    # one head a layer: every region's linears (the decoder layers' shapes, alike) under each layer's head,
    # averaged over the layers; each distinct head estimated once (one, for a single dense_fraction)
    heads = Counter(fold_ops.layer_dense_fraction(tuning.dense_fraction, i, regions) for i in range(max(regions, 1)))
    savings = {f: fold_ops.fold_saving_us(n * block, weight_shapes, f, tuning.min_spill_us, itemsize, costs=tuning)
               for f in heads}
    saving = (next(iter(savings.values())) if len(savings) == 1
              else sum(heads[f] * s for f, s in savings.items()) / sum(heads.values()))
    return saving > tuning.fold_overhead_us * regions


def fold_plan(gm: GraphModule, settings: Any) -> FoldPlan:
    """The fold decision of a foldable graph (after ``find_regions``), from ``settings.fold_min_branches``."""
    analysis: Analysis = gm.meta["specfold"]
    marker_value = analysis.marker.meta["example_value"]
    n, block = marker_value.shape[0], marker_value.shape[1]
    k, planned = settings.tuning.fold_min_branches, settings.tuning.max_planned_branches
    impl = resolve_impl(settings.kernels, marker_value.device.type)
    cost_model = k is None and _cost_model_applies(impl, marker_value.device.type) and type(block) is int
    launched_plain = cost_model and not settings.tuning.fold_launched
    launched = ("; launched calls (not captured in a CUDA graph) run the plain graph, the first at each N also "
                "warming the folded one (fold_launched=False)") if launched_plain else ""
    if k is not None:
        fold_at = lambda b: b >= k  # noqa: E731
        why = f"fold_min_branches={k}: fold calls with N >= {k}"
    elif cost_model:
        shapes, itemsize = _weight_shapes(analysis)
        regions = len(analysis.layers) + (analysis.head is not None)
        memo: dict[int, bool] = {}

        def fold_at(b: int) -> bool:
            if b not in memo:
                memo[b] = cost_model_folds(b, block, shapes, regions, settings, itemsize)
            return memo[b]
        why = (f"cost model: fold a call when its {len(shapes)} linears are estimated to save more than "
               f"{settings.tuning.fold_overhead_us:g} us x {regions} gated regions")
    else:
        fold_at = lambda b: b >= 2  # noqa: E731
        why = f"fold every multi-branch call (no cost model for kernels={impl} on {marker_value.device.type})"
    if type(n) is int:
        folds = fold_at(n)
        both = folds and launched_plain  # the plain graph too, for launched calls
        return FoldPlan(fold_at, "both" if both else "folded" if folds else "plain", description=(
            f"{why}; N = {n} (static): {'folded' if folds else 'not folded, the plain graph runs'}"
            f"{launched if both else ''}"), decisions={n: folds}, launched_plain=both, static_n=n)
    decisions = {b: fold_at(b) for b in range(2, planned + 1)}
    folded = sorted(b for b, f in decisions.items() if f)
    if not folded:
        return FoldPlan(fold_at, "plain", description=(
            f"{why}; no N up to {planned} folds: the plain graph runs"), decisions=decisions)
    if len(folded) == len(decisions) and not launched_plain:
        return FoldPlan(fold_at, "folded", description=f"{why}; every N folds", decisions=decisions)
    index, is_dim = _n_input(gm, n)
    if index is None:  # (launched calls fold too: without N the folded graph cannot be warmed per N)
        return FoldPlan(lambda b: True, "folded", description=(
            f"{why}; but no graph input carries N, so every call folds, launched ones too"), decisions=decisions)
    plain = [b for b, f in decisions.items() if not f]
    where = f"folded from N = {folded[0]} (plain at N = {_ranges(plain)})" if plain else "every N folds"
    return FoldPlan(fold_at, "both", index, is_dim, description=(
        f"{why}; {where}: plain graph compiled alongside{launched}"), decisions=decisions,
        launched_plain=launched_plain)


def _ranges(values: list[int]) -> str:
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)


_fold_launched = contextvars.ContextVar("specfold_fold_launched", default=False)


@contextlib.contextmanager
def fold_launched_calls():
    """Inside it, launched calls fold wherever captured ones would (as with ``fold_launched=True``): for
    ``collect_stats`` on calls that would otherwise run the plain graph, or to time them folded. Per
    context (thread / asyncio task), like ``collect_stats``."""
    token = _fold_launched.set(True)
    try:
        yield
    finally:
        _fold_launched.reset(token)


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a CUDA graph (False without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class FoldDispatch:
    """Runs the folded or the plain compiled graph, by the call's branch count and, with
    ``plan.launched_plain``, by whether the call is being captured into a CUDA graph."""

    def __init__(self, folded: Callable, plain: Callable, plan: FoldPlan) -> None:
        self.folded, self.plain, self.plan = folded, plain, plan
        self.warm: set[int | None] = set()  # Ns at which the folded graph has run

    def __call__(self, *args: Any) -> Any:
        n = self.plan.branches(args)
        if self.plan.fold_at(n):
            if not self.plan.launched_plain or _fold_launched.get() or capturing():
                self.warm.add(n)
                return self.folded(*args)
            if n not in self.warm:  # warm the folded graph for a later capture (its result is not used)
                with stats.suspended():
                    self.folded(*args)
                self.warm.add(n)
            stats.record_launched_plain_call()
        stats.record_plain_call()
        return self.plain(*args)
