"""The pass contract: ``find_regions(gm) -> RegionPlan``; every rewrite ``(gm, plan, settings) -> (gm, plan)``.

A ``RegionPlan`` names the fx nodes a verification graph is made of (the branch marker, each decoder
layer's residual adds, attention and position-wise regions, the head region) and why a graph cannot be
folded (``Blocker``). It is frozen: a rewrite that replaces nodes returns a new plan naming the new ones
(``dataclasses.replace``), so what a pass reads is what the pass before it returned, never a record
mutated on the side. The graph module itself is rewritten in place, as fx graphs are.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch.fx import Node


@dataclass(frozen=True)
class Blocker:
    """Why a verification graph runs unchanged."""

    kind: str  # unsupported_op | outside_value | escaping_value | layout | no_residual | no_layers | multiple_markers
    detail: str
    layer: int | None = None
    node: str | None = None

    def __str__(self) -> str:
        where = f"layer {self.layer}" if self.layer is not None else "graph"
        at = f" at node {self.node!r}" if self.node else ""
        return f"[{self.kind}] {where}{at}: {self.detail}"


@dataclass(frozen=True, eq=False)
class RowPlan:
    """A gate's outputs as graph values: the computed rows (flat n * B + b), their count, every row's
    slot in ``rows`` (its origin's), and R = len(rows) for the packed views."""

    rows: Node
    count: Node
    slot: Node
    n_rows: Node


@dataclass(frozen=True)
class LayerRegion:
    """One decoder layer: ``h_mid = h_in + attention(...)``, ``h_out = h_mid + mlp_out``."""

    index: int
    name: str  # the module path, e.g. "model.layers.0"
    h_in: Node
    attention: Node
    h_mid: Node
    h_out: Node
    mlp_out: Node
    pre_attention: tuple[Node, ...]  # h_in -> q, k, v
    mlp: tuple[Node, ...]  # h_mid -> mlp_out
    # Set by the rewrites.
    gates: tuple[Node, ...] = ()  # fold_gate nodes (1, or 2 with gate="sublayer")
    plans: tuple[RowPlan, ...] = ()  # pre-attention plan, MLP plan (the same object with one gate)
    packed_linears: tuple[tuple[Node, RowPlan], ...] = ()  # (packed F.linear, the plan of its rows)
    rewritten: tuple[str, ...] = ()  # what each rewrite did, for the region report

    @property
    def label(self) -> str:
        return f"layer {self.index}"


@dataclass(frozen=True)
class HeadRegion:
    """The position-wise ops after the last layer (final norm, LM head), folded with ``fold_head``."""

    h_in: Node
    nodes: tuple[Node, ...]
    outputs: tuple[Node, ...]  # region values read outside it (the logits, before any logit shift)
    gates: tuple[Node, ...] = ()
    plans: tuple[RowPlan, ...] = ()
    packed_linears: tuple[tuple[Node, RowPlan], ...] = ()
    rewritten: tuple[str, ...] = ()

    label = "head"


Region = LayerRegion | HeadRegion


def rewritten(region: Region, what: str, **changes) -> Region:
    """``region`` with ``what`` added to its rewrite log and ``changes`` applied."""
    return dataclasses.replace(region, rewritten=region.rewritten + (what,), **changes)


@dataclass(frozen=True)
class RegionPlan:
    marker: Node | None = None  # the specfold::branches node
    parents: Node | None = None  # the graph value the marker carries
    layers: tuple[LayerRegion, ...] = ()
    head: HeadRegion | None = None
    blockers: tuple[Blocker, ...] = ()
    skip_reason: str | None = None  # set when the graph is not a multi-branch verification graph at all
    notes: tuple[str, ...] = ()
    tau: Node | None = None  # the 0-d tau constant every gate reads (set by insert_gates)

    @property
    def foldable(self) -> bool:
        return self.skip_reason is None and not self.blockers and bool(self.layers)

    @property
    def regions(self) -> tuple[Region, ...]:
        """Every gated region: the layers, then the head (with fold_head)."""
        return self.layers + ((self.head,) if self.head is not None else ())

    def noted(self, note: str) -> "RegionPlan":
        return dataclasses.replace(self, notes=self.notes + (note,))

    def with_regions(self, regions: list[Region] | tuple[Region, ...], **changes) -> "RegionPlan":
        """This plan with ``regions`` (as ordered by ``regions``) in place of its own."""
        layers = tuple(r for r in regions if isinstance(r, LayerRegion))
        heads = [r for r in regions if isinstance(r, HeadRegion)]
        return dataclasses.replace(self, layers=layers, head=heads[0] if heads else None, **changes)
