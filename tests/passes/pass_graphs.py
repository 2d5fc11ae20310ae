"""A small hand-built verification graph for the unit tests of single passes.

One decoder layer written with functional ops and traced by ``torch.fx.symbolic_trace`` (no Dynamo):
RMS norm, a fused q/k/v projection, a position table multiplied into q (as RoPE's cos is), the branch
attention, the output projection, then a SwiGLU MLP with separate gate and up projections, and a head
(RMS norm, LM head). Every node carries its example value as Dynamo leaves it (``meta["example_value"]``),
propagated from fake inputs.
"""
from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, symbolic_trace
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from specfold_compile.backend import SpecFoldSettings, collect_stats
from specfold_compile.passes import REWRITES, RegionPlan, find_regions

N, B, C, HEADS, D, HIDDEN, VOCAB = 3, 4, 16, 2, 8, 24, 32
BRANCHES = torch.ops.specfold.branches.default  # registered by importing specfold_compile
ATTENTION = torch.ops.specfold.branch_attention.default


def _rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def verifier(h0, parents, k_pre, v_pre, table, w_qkv, w_o, w_gate, w_up, w_down, w_head):
    h = BRANCHES(h0, parents)
    qkv = F.linear(_rms(h), w_qkv).view(N, B, 3, HEADS, D).unbind(2)
    q = qkv[0] * table
    attn = ATTENTION(q, qkv[1], qkv[2], k_pre, v_pre, D ** -0.5)
    h_mid = h + F.linear(attn.reshape(N, B, HEADS * D), w_o)
    y = _rms(h_mid)
    h_out = h_mid + F.linear(F.silu(F.linear(y, w_gate)) * F.linear(y, w_up), w_down)
    return F.linear(_rms(h_out), w_head)


# The regions of ``verifier``, op by op:
#   pre-attention: RMS norm (pow, mean, add, rsqrt, mul) 5, linear, view, unbind, 3 getitem, mul(table) = 12
#   MLP: RMS norm 5, gate linear, silu, up linear, mul, down linear                                  = 10
#   head: RMS norm 5, LM head linear                                                                  = 6
PRE_ATTENTION_OPS, MLP_OPS, HEAD_OPS = 12, 10, 6


def inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Every draft row a copy of its parent (so rows fold at any tau > 0) except one position."""
    g = torch.Generator().manual_seed(seed)
    main = torch.randn(1, B, C, generator=g)
    h0 = main.repeat(N, 1, 1)
    h0[1:, 1] += torch.randn(N - 1, C, generator=g)
    weights = [torch.randn(*shape, generator=g) / shape[1] ** 0.5 for shape in
               ((3 * HEADS * D, C), (C, HEADS * D), (HIDDEN, C), (HIDDEN, C), (C, HIDDEN), (VOCAB, C))]
    return (h0, torch.tensor([-1, 0, 1]), torch.randn(HEADS, 5, D, generator=g), torch.randn(HEADS, 5, D, generator=g),
            torch.randn(B, 1, D, generator=g), *weights)


def build() -> tuple[GraphModule, tuple[torch.Tensor, ...]]:
    gm = symbolic_trace(verifier)
    example = inputs()
    FakeTensorProp(gm).propagate(*example)
    for node in gm.graph.nodes:
        if "val" in node.meta:
            node.meta["example_value"] = node.meta["val"]
    return gm, example


def count(gm: GraphModule) -> Counter:
    """Call nodes by target (methods as "Tensor.<name>")."""
    c: Counter = Counter()
    for n in gm.graph.nodes:
        if n.op == "call_function":
            c[n.target] += 1
        elif n.op == "call_method":
            c[f"Tensor.{n.target}"] += 1
    return c


def diff(before: Counter, after: Counter) -> dict:
    return {k: after[k] - before[k] for k in set(before) | set(after) if after[k] != before[k]}


def settings(**options) -> SpecFoldSettings:
    return SpecFoldSettings(**{"kernels": "torch", "tau": 0.5, **options})


def prepared(before: str, **options) -> tuple[GraphModule, RegionPlan, SpecFoldSettings, tuple[torch.Tensor, ...]]:
    """The hand-built graph after ``find_regions`` and every rewrite that runs before ``before``."""
    gm, example = build()
    opts = settings(**options)
    plan = find_regions(gm, opts)
    for name, rewrite in REWRITES:
        if name == before:
            break
        gm, plan = rewrite(gm, plan, opts)
    return gm, plan, opts, example


def run(gm: GraphModule, example: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The graph's output and the fold masks its gates reported."""
    with collect_stats() as s:
        out = gm(*example)
    return out, s.fold_masks


def inserted(gm: GraphModule) -> list[tuple[str, dict]]:
    """(target name, annotation) of every node the passes annotated."""
    return [(getattr(n.target, "__name__", str(n.target)), n.meta["specfold"]) for n in gm.graph.nodes
            if "specfold" in n.meta]
