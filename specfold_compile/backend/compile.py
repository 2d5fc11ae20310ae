"""One graph through the backend: the passes (``run_passes``), the fold plan, the lowering, the record."""

from __future__ import annotations

import copy
import dataclasses
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.fx import GraphModule

from .. import passes
from ..passes import RegionPlan
from . import dispatch, logs, recompile_limit
from .dispatch import FoldPlan
from .dumps import GraphDumps
from .records import GraphRecord, PassRecord, SpecFoldError, op_count, region_records, region_report
from .settings import SpecFoldSettings

log = logs.log


@dataclass(frozen=True)
class Rewrite:
    """The passes' result for one graph."""

    gm: GraphModule  # the graph to lower (rewritten in place)
    plan: RegionPlan
    fold_plan: FoldPlan | None  # None: nothing could fold (no marker, N = 1, blockers, fold=False)
    plain: GraphModule | None  # with fold_plan.variants == "both": the graph as traced, for the plain calls
    passes: tuple[PassRecord, ...]
    report: str


class _PlanView:
    """What ``dispatch.fold_plan`` reads of a graph module: its graph, and the region plan under
    ``meta["specfold"]``; given here so that the graph module itself carries no plan."""

    def __init__(self, gm: GraphModule, plan: RegionPlan) -> None:
        self.graph, self.meta = gm.graph, {"specfold": plan}


def _rewrites(settings: SpecFoldSettings, plan: RegionPlan, fold_plan: FoldPlan | None) -> list:
    rewrites = list(passes.REWRITES)
    if not settings.fold or (fold_plan is not None and fold_plan.variants == "plain"):
        return [r for r in rewrites if r[0] == "strip_marker"]  # no call would fold: only strip the marker
    if not settings.attention_correction:
        return [r for r in rewrites if r[0] != "fold_attention"]
    return rewrites


def _check_plan(plan: RegionPlan, settings: SpecFoldSettings, dumps: GraphDumps) -> None:
    """Warn (or, strict, raise) where a verification graph will run unchanged."""
    if settings.fold_head and settings.fold and plan.layers and plan.head is None:
        # asked for and not applied: say so (e.g. logits of selected positions only)
        warnings.warn("specfold: fold_head=True, but no position-wise op reads the last layer's output "
                      "(logit_positions selects rows before the head?): the head runs dense", stacklevel=3)
    if plan.skip_reason:
        log.debug("specfold: graph left unchanged: %s", plan.skip_reason)
    elif plan.blockers:
        if settings.strict:
            dumps.report(region_report(plan, settings))
            raise SpecFoldError(plan.blockers)
        warnings.warn("specfold: running this graph unchanged (no folding) because of:\n  "
                      + "\n  ".join(str(b) for b in plan.blockers), stacklevel=3)


def run_passes(gm: GraphModule, settings: SpecFoldSettings, dumps: GraphDumps | None = None,
               progress: logs.CompileProgress | None = None) -> Rewrite:
    """Run the pass pipeline on a Dynamo graph (rewritten in place)."""
    dumps = dumps if dumps is not None else GraphDumps(settings.dump_dir)
    dumps.graph(0, "input", gm)
    logs.graph_step(0, "input", gm)
    plan = passes.find_regions(gm, settings)
    fold_plan = plain = None
    if plan.foldable and settings.fold:
        fold_plan = dispatch.fold_plan(_PlanView(gm, plan), settings)
        plan = plan.noted(fold_plan.description)
        if fold_plan.variants == "both":
            # the rewrites change gm in place: keep the graph as traced for the plain calls (shares gm's
            # parameters and buffers; only the graph's nodes are copied)
            plain = GraphModule(gm, copy.deepcopy(gm.graph))
    _check_plan(plan, settings, dumps)
    records = []
    rewrites = _rewrites(settings, plan, fold_plan)
    for index, (name, rewrite) in enumerate(rewrites, start=1):
        if progress is not None:
            progress.step = f"pass {name}"
        before, start = op_count(gm), time.perf_counter()
        gm, plan = rewrite(gm, plan, settings)
        records.append(PassRecord(name, before, op_count(gm), time.perf_counter() - start))
        dumps.graph(index, name, gm, final=index == len(rewrites))
        logs.graph_step(index, name, gm)
    report = region_report(plan, settings)
    dumps.report(report)
    logs.region_report(report)
    return Rewrite(gm, plan, fold_plan, plain, tuple(records), report)


def compile_graph(gm: GraphModule, settings: SpecFoldSettings) -> GraphModule:
    """Run the pass pipeline on a Dynamo graph; returns the graph module to execute."""
    return run_passes(gm, settings).gm


def _use_inductor(settings: SpecFoldSettings, example_inputs: list[Any]) -> bool:
    if settings.inductor is not None:
        return settings.inductor
    # auto: Inductor fuses the elementwise work between the fold ops on the GPU (its GPU code is Triton too)
    from .. import kernels

    return kernels.triton_available() and any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)


def compile_with_record(gm: GraphModule, example_inputs: list[Any],
                        settings: SpecFoldSettings) -> tuple[Callable, GraphRecord]:
    """The callable Dynamo runs for ``gm``, and the record of what was done."""
    function = recompile_limit.current_function()  # None outside a Dynamo compile
    compile_id = recompile_limit.compile_id()
    title = f"graph {compile_id} of {function or 'a function'}"
    with logs.CompileProgress(title) as progress:
        rewrite = run_passes(gm, settings, GraphDumps(settings.dump_dir, title), progress)
        recompile_limit.watch(function, settings.strict,
                              verification=rewrite.plan.marker is not None)
        inductor = _use_inductor(settings, example_inputs)

        def lower(graph_module: GraphModule) -> Callable:
            if not inductor:
                return graph_module.forward
            from torch._inductor.compile_fx import compile_fx

            progress.step = "Inductor lowering"
            patches = {"combo_kernels": True} if settings.combo_kernels else None
            return compile_fx(graph_module, example_inputs, config_patches=patches)

        compiled = lower(rewrite.gm)
        if rewrite.plain is not None:
            plain = compile_graph(rewrite.plain, dataclasses.replace(settings, fold=False, dump_dir=None))
            compiled = dispatch.FoldDispatch(compiled, lower(plain), rewrite.fold_plan)
    fold_plan = rewrite.fold_plan
    record = GraphRecord(function or "?", compile_id, fold_plan is not None and fold_plan.variants != "plain",
                         rewrite.plan.skip_reason, rewrite.plan.blockers, fold_plan,
                         region_records(rewrite.plan), rewrite.passes, progress.seconds, rewrite.report)
    logs.graph_record(record)
    return compiled, record
