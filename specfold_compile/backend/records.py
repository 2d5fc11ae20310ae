"""What the backend did with each graph: ``GraphRecord`` (kept by ``SpecFoldBackend.graphs``) and the
region report (``dump_dir/graph_NN/regions.txt``, the ``specfold_graphs`` log)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.fx import GraphModule

from ..passes import Blocker, RegionPlan


class SpecFoldError(RuntimeError):
    """Raised in strict mode when a verification graph cannot be folded."""

    def __init__(self, blockers: list[Blocker] | tuple[Blocker, ...]) -> None:
        self.blockers = list(blockers)
        super().__init__("specfold cannot fold this graph:\n  " + "\n  ".join(str(b) for b in self.blockers))


def op_count(gm: GraphModule) -> int:
    """The graph's operations (call nodes): what a pass adds or removes."""
    return sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


@dataclass(frozen=True)
class PassRecord:
    """One rewrite of one graph: its operations before and after, and how long it took."""

    name: str
    ops_before: int
    ops_after: int
    seconds: float

    def __str__(self) -> str:
        return f"{self.name} {self.ops_before} -> {self.ops_after} ops ({self.ops_after - self.ops_before:+d})"


@dataclass(frozen=True)
class RegionRecord:
    """One gated region of a graph, as the passes left it."""

    label: str  # "layer 0", "head"
    module: str  # the model's module path ("model.layers.0"; "" for the head)
    ops: int  # the model's operations in the region (pre-attention + MLP, or the head's)
    rewritten: tuple[str, ...]  # what each rewrite did to it

    def __str__(self) -> str:
        module = f" ({self.module})" if self.module else ""
        return f"{self.label}{module}: {self.ops} ops; rewritten: {', '.join(self.rewritten) or 'nothing'}"


def region_records(plan: RegionPlan) -> tuple[RegionRecord, ...]:
    records = [RegionRecord(layer.label, layer.name, len(layer.pre_attention) + len(layer.mlp), layer.rewritten)
               for layer in plan.layers]
    if plan.head is not None:
        records.append(RegionRecord(plan.head.label, "", len(plan.head.nodes), plan.head.rewritten))
    return tuple(records)


@dataclass(frozen=True, repr=False)
class GraphRecord:
    """What the backend did with one graph Dynamo handed it (``SpecFoldBackend.graphs``)."""

    function: str  # the Python function Dynamo compiled, "'forward' (file:line)" ("?" outside Dynamo)
    compile_id: str  # Dynamo's "frame/compile" id
    folded: bool  # rewritten: its calls fold (those the fold plan picks)
    skip_reason: str | None  # not a verification graph at all (no marker, or N = 1)
    blockers: tuple[Blocker, ...]  # why a verification graph runs unchanged
    fold_plan: Any  # backend.dispatch.FoldPlan: which calls fold (None when nothing could fold)
    regions: tuple[RegionRecord, ...]  # the gated regions found
    passes: tuple[PassRecord, ...]  # the rewrites that ran, in order
    compile_seconds: float  # the passes and the lowering (Inductor), the plain variant's included
    report: str  # the region report (as written to dump_dir/graph_NN/regions.txt)

    def __repr__(self) -> str:
        state = "folded" if self.folded else "not folded"
        lines = [f"GraphRecord(compile {self.compile_id} of {self.function}: {state}, "
                 f"compiled in {self.compile_seconds:.2f} s"]
        if self.skip_reason:
            lines.append(f"  not a verification graph: {self.skip_reason}")
        lines += [f"  region {r}" for r in self.regions]
        if self.fold_plan is not None:
            lines.append(f"  fold plan: {self.fold_plan.description}")
        if self.passes:
            lines.append("  passes: " + "; ".join(str(p) for p in self.passes))
        lines += [f"  blocker {b}" for b in self.blockers]
        return "\n".join(lines) + ")"


def region_report(plan: RegionPlan, settings: Any) -> str:
    lines = [f"specfold region report ({settings})"]
    if plan.skip_reason:
        lines.append(f"not rewritten: {plan.skip_reason}")
    lines.append(f"decoder layers found: {len(plan.layers)}")
    for layer in plan.layers:
        lines.append(f"  layer {layer.index} ({layer.name}): {len(layer.pre_attention)} pre-attention ops, "
                     f"{len(layer.mlp)} MLP ops; rewritten: {', '.join(layer.rewritten) or 'nothing'}")
    if plan.head is not None:
        lines.append(f"  head: {len(plan.head.nodes)} ops after the last layer; rewritten: "
                     f"{', '.join(plan.head.rewritten) or 'nothing'}")
    lines += [f"blocker: {b}" for b in plan.blockers]
    lines += [f"note: {note}" for note in plan.notes]
    return "\n".join(lines) + "\n"
