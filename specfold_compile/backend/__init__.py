"""The ``specfold`` torch.compile backend.

Registered through the ``torch_dynamo_backends`` entry point (pyproject.toml), so
``torch.compile(model, backend="specfold", options={...})`` works without importing this package;
``torch.compile(model, backend=SpecFoldBackend(**options))`` validates the options up front and keeps a
record of every graph it compiles.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata
import logging
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch.fx import GraphModule

from .. import passes
from ..ops.fold_ops import invalid_parents_seen
from . import dispatch, recompile_limit
from .dispatch import fold_launched_calls
from .recompile_limit import RecompileLimitError
from .settings import SpecFoldSettings
from ..ops.stats import FoldStats, collect_stats

log = logging.getLogger("specfold_compile")

__all__ = ["specfold_backend", "SpecFoldBackend", "GraphRecord", "compile_graph", "SpecFoldSettings", "SpecFoldError",
           "RecompileLimitError", "collect_stats", "FoldStats", "fold_launched_calls", "invalid_parents_seen"]


class SpecFoldError(RuntimeError):
    """Raised in strict mode when a verification graph cannot be folded."""

    def __init__(self, blockers: list) -> None:
        self.blockers = list(blockers)
        super().__init__("specfold cannot fold this graph:\n  " + "\n  ".join(str(b) for b in self.blockers))


class _Dumper:
    def __init__(self, dump_dir: str | None) -> None:
        self.dir = Path(dump_dir) if dump_dir else None
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.graph_id = sum(1 for _ in self.dir.glob("*_find_regions_before.py"))

    def graph(self, step: int, name: str, when: str, gm: GraphModule) -> None:
        if self.dir is not None:
            prefix = f"g{self.graph_id}_" if self.graph_id else ""
            (self.dir / f"{prefix}{step:02d}_{name}_{when}.py").write_text(gm.print_readable(print_output=False))

    def report(self, text: str) -> None:
        if self.dir is not None:
            prefix = f"g{self.graph_id}_" if self.graph_id else ""
            (self.dir / f"{prefix}regions.txt").write_text(text)


def region_report(gm: GraphModule, settings: SpecFoldSettings) -> str:
    a = gm.meta.get("specfold")
    lines = [f"specfold region report ({settings})"]
    if a is None:
        return "\n".join(lines + ["(no analysis)"])
    if a.skip_reason:
        lines.append(f"not rewritten: {a.skip_reason}")
    lines.append(f"decoder layers found: {len(a.layers)}")
    for layer in a.layers:
        lines.append(f"  layer {layer.index} ({layer.name}): {len(layer.pre_attention)} pre-attention ops, "
                     f"{len(layer.mlp)} MLP ops; rewritten: {', '.join(layer.rewritten) or 'nothing'}")
    if a.head is not None:
        lines.append(f"  head: {len(a.head.nodes)} ops after the last layer; rewritten: "
                     f"{', '.join(a.head.rewritten) or 'nothing'}")
    for b in a.blockers:
        lines.append(f"blocker: {b}")
    for note in a.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def compile_graph(gm: GraphModule, settings: SpecFoldSettings) -> GraphModule:
    """Run the pass pipeline on a Dynamo graph; returns the graph module to execute."""
    dumper = _Dumper(settings.dump_dir)
    pipeline = list(passes.PIPELINE)
    if not settings.fold:
        pipeline = [p for p in pipeline if p[0] in ("find_regions", "strip_marker")]
    if not settings.attention_correction:
        pipeline = [p for p in pipeline if p[0] != "fold_attention"]
    step = 0
    while step < len(pipeline):
        name, fn = pipeline[step]
        dumper.graph(step, name, "before", gm)
        gm = fn(gm, settings)
        dumper.graph(step, name, "after", gm)
        step += 1
        if name == "find_regions":
            analysis = gm.meta["specfold"]
            if analysis.foldable and settings.fold:
                analysis.fold_plan = dispatch.fold_plan(gm, settings)
                analysis.notes.append(analysis.fold_plan.description)
                if analysis.fold_plan.variants == "plain":  # no call would fold: only strip the marker
                    pipeline = pipeline[:step] + [p for p in pipeline[step:] if p[0] == "strip_marker"]
                elif analysis.fold_plan.variants == "both":
                    # the passes below rewrite gm in place: keep the graph as traced for the plain calls
                    # (shares gm's parameters and buffers; only the graph's nodes are copied)
                    analysis.fold_plan.traced = GraphModule(gm, copy.deepcopy(gm.graph))
            if settings.fold_head and settings.fold and analysis.layers and analysis.head is None:
                # asked for and not applied: say so (e.g. logits of selected positions only)
                warnings.warn("specfold: fold_head=True, but no position-wise op reads the last layer's output "
                              "(logit_positions selects rows before the head?): the head runs dense", stacklevel=2)
            if analysis.skip_reason:
                log.debug("specfold: graph left unchanged: %s", analysis.skip_reason)
            elif analysis.blockers:
                if settings.strict:
                    dumper.report(region_report(gm, settings))
                    raise SpecFoldError(analysis.blockers)
                warnings.warn("specfold: running this graph unchanged (no folding) because of:\n  "
                              + "\n  ".join(str(b) for b in analysis.blockers), stacklevel=2)
    dumper.report(region_report(gm, settings))
    return gm


@dataclasses.dataclass(frozen=True)
class GraphRecord:
    """What the backend did with one graph Dynamo handed it (``SpecFoldBackend.graphs``)."""

    function: str  # the Python function Dynamo compiled, "'forward' (file:line)" ("?" outside Dynamo)
    compile_id: str  # Dynamo's "frame/compile" id
    folded: bool  # rewritten: its calls fold (those the fold plan picks)
    skip_reason: str | None  # not a verification graph at all (no marker, or N = 1)
    blockers: tuple  # passes.Blocker: why a verification graph runs unchanged
    fold_plan: str | None  # which calls fold (FoldPlan.description)
    report: str  # the region report (as written to dump_dir/regions.txt)


def _compile(gm: GraphModule, example_inputs: list[Any], settings: SpecFoldSettings) -> tuple[Callable, GraphRecord]:
    function = recompile_limit.current_function()
    gm = compile_graph(gm, settings)
    analysis = gm.meta["specfold"]
    recompile_limit.watch(function, settings.strict, verification=analysis.marker is not None)
    plan = getattr(analysis, "fold_plan", None)
    folded = plan is not None and plan.variants != "plain"
    record = GraphRecord(function or "?", recompile_limit.compile_id(), folded,
                         analysis.skip_reason, tuple(analysis.blockers),
                         plan.description if plan is not None else None, region_report(gm, settings))
    inductor = settings.inductor
    if inductor is None:  # auto: Inductor fuses the elementwise work between the fold ops on the GPU
        from .. import kernels  # (Inductor's GPU code is Triton too)

        inductor = kernels.triton_available() and any(isinstance(t, torch.Tensor) and t.is_cuda
                                                      for t in example_inputs)

    def lower(graph_module: GraphModule) -> Callable:
        if inductor:
            from torch._inductor.compile_fx import compile_fx

            patches = {"combo_kernels": True} if settings.combo_kernels else None
            return compile_fx(graph_module, example_inputs, config_patches=patches)
        return graph_module.forward

    compiled = lower(gm)
    if plan is None or plan.variants != "both":
        return compiled, record
    plain = compile_graph(plan.traced, dataclasses.replace(settings, fold=False, dump_dir=None))
    return dispatch.FoldDispatch(compiled, lower(plain), plan), record


def specfold_backend(gm: GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None,
                     mode: str | None = None, **unused: Any) -> Callable:
    """torch.compile backend entry point (``backend="specfold"``, ``options={...}``)."""
    return _compile(gm, example_inputs, SpecFoldSettings.from_options(options))[0]


class SpecFoldBackend:
    """The backend as an object: ``torch.compile(model, backend=SpecFoldBackend(tau=0.1, ...))``.

    Takes the options of ``SpecFoldSettings`` as keyword arguments and validates them here, at
    construction (an unknown name or a bad value is a one-line error naming the option), not at the first
    compile inside Dynamo. ``graphs`` lists a ``GraphRecord`` per graph compiled (region report, blockers,
    fold plan). Reuse one object for one set of options: Dynamo keeps a model's graphs per backend
    object, so a new object per call compiles again. ``backend="specfold"`` with ``options={...}``
    compiles the same way.
    """

    def __init__(self, **options: Any) -> None:
        self.settings = SpecFoldSettings.from_options(options)
        self.graphs: list[GraphRecord] = []

    def __call__(self, gm: GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
        if kwargs:
            raise TypeError(f"SpecFoldBackend: options go to SpecFoldBackend(...), not torch.compile; got "
                            f"{sorted(kwargs)}")
        compiled, record = _compile(gm, example_inputs, self.settings)
        self.graphs.append(record)
        return compiled

    def __repr__(self) -> str:
        return f"SpecFoldBackend({self.settings})"


# backend="specfold" without an installed package (a source checkout on PYTHONPATH, as on the GPU
# machine): the entry point in pyproject.toml registers the name only for installed copies. Where the
# entry point exists, leave the name to it: a lookup of "specfold" loads this module and then registers
# the name itself, which a registration here would make a duplicate. (Reading the entry points is what
# Dynamo does too; torch._dynamo.list_backends would import every Dynamo backend, ~1 s.)
if "specfold" not in importlib.metadata.entry_points(group="torch_dynamo_backends").names:
    try:
        torch._dynamo.register_backend(specfold_backend, name="specfold")
    except AssertionError:  # registered already in this process (the module executed again)
        pass
