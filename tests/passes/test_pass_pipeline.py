"""Unit tests of the passes: the pipeline is run one pass at a time on a graph captured from Dynamo, ops
are counted by target before and after each pass, and the graph is executed after every pass."""
from __future__ import annotations

import functools
import operator
import re
from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from specfold_compile.testing import ModelSpec, assert_close, capture_graph, make_cache, make_tree
from specfold_compile import passes
from specfold_compile.backend import SpecFoldSettings, collect_stats, compile_graph, run_passes
from specfold_compile.ops import fold_ops
from specfold_compile.passes import ops_table as T
from specfold_compile.passes.insert_gates import TAU_NODE
from specfold_compile.passes.op_args import schema_arguments
from specfold_compile.reference import folded_verify

TAU = 0.3
LINEARS = tuple(T.LINEAR_FUNCTIONS)
GATE, FOLDED, PACKED_LINEAR = fold_ops.FOLD_GATE, fold_ops.FOLDED_ATTENTION, fold_ops.PACKED_LINEAR
SILU_MUL = fold_ops.PACKED_SILU_MUL
ATTN, MARKER = T.BRANCH_ATTENTION, T.BRANCH_MARKER
PASS_NAMES = [name for name, _ in passes.PIPELINE]

# Region sizes of the packaged decoder layer (transformer.DecoderLayer), op by op, with q/k/v and gate/up
# fused (the models' default) or not (fuse_projections=False):
#   RMSNorm: float, pow, mean, add, rsqrt, mul, to, mul(weight)                  = 8
#   q/k/v: fused linear, split, 3 getitem + view each                            = 8 (unfused: 3 linear + 3 view = 6)
#   RoPE on q and on k: mul, getitem, neg, getitem, cat, mul, add                 = 2 * 7
#   NLD only: Llama-4 query scaling q * q_scale                                   = 1
#   MLP region: RMSNorm (8) + fused gate_up linear, split, 2 getitem, silu, mul, down linear (7)
#               (unfused: gate linear, silu, up linear, mul, down linear (5))
def pre_attention_ops(family: str, fused: bool) -> int:
    return 8 + (8 if fused else 6) + 14 + (family == "nld")


def mlp_ops(fused: bool) -> int:
    return 8 + (7 if fused else 5)


def layer_linears(fused: bool) -> tuple[int, int]:
    """Linears of the pre-attention and MLP regions (o_proj sits between them, outside both)."""
    return (1, 2) if fused else (3, 3)


# Position tables packed per layer: cos and sin (RoPE), and q_scale for NLD.
PACKED_EXTERNALS = {"fast-dllm-v2": 2, "nld": 3}


def count(gm) -> Counter:
    c: Counter = Counter()
    for n in gm.graph.nodes:
        if n.op == "call_function":
            c[n.target] += 1
        elif n.op == "call_method":
            c[f"Tensor.{n.target}"] += 1
        elif n.op in ("get_attr", "placeholder", "output"):
            c[n.op] += 1
    return c


def linears(c: Counter) -> int:
    return sum(c[t] for t in LINEARS)


def diff(before: Counter, after: Counter) -> dict:
    keys = set(before) | set(after)
    return {k: after[k] - before[k] for k in keys if after[k] != before[k]}


@dataclass
class Stage:
    name: str
    before: Counter
    after: Counter
    code_before: str
    code_after: str
    out: torch.Tensor
    masks: list = field(default_factory=list)
    snap: dict = field(default_factory=dict)  # the analysis as it was right after this pass


@dataclass
class Run:
    spec: ModelSpec
    settings: SpecFoldSettings
    model: object
    inputs: tuple
    example_inputs: list
    gm: object
    plan: object
    stages: dict
    dense: torch.Tensor

    @property
    def n_layers(self) -> int:
        return self.spec.layers

    @property
    def n_gates(self) -> int:
        return self.n_layers * (2 if self.settings.gate == "sublayer" else 1)

    def reference(self, masks):
        return folded_verify(self.model, *self.inputs, TAU, fold_masks=masks, gate=self.settings.gate)[0]


def snapshot(gm, a) -> dict:
    """The region plan ``a`` (whose nodes later passes replace) as plain data."""
    layers = []
    for layer in a.layers:
        layers.append(dict(
            index=layer.index, name=layer.name, h_in=layer.h_in.name, h_mid=layer.h_mid.name,
            h_out=layer.h_out.name, h_mid_target=layer.h_mid.target, h_out_target=layer.h_out.target,
            attention=layer.attention.target,
            attention_inputs=[schema_arguments(layer.attention)[name].target for name in
                              (("q_p", "k_p", "v_p") if layer.attention.target is FOLDED else ("q", "k", "v"))],
            pre=[n.name for n in layer.pre_attention], mlp=[n.name for n in layer.mlp],
            pre_linears=sum(n.target in LINEARS for n in layer.pre_attention),
            mlp_linears=sum(n.target in LINEARS for n in layer.mlp),
            pre_rsqrt=sum(n.target is torch.rsqrt for n in layer.pre_attention),
            gates=[(g.kwargs["h"].name, g.kwargs["parents"].name, g.kwargs["tau"].op, g.kwargs["gate_index"],
                    g.kwargs["pack"], g.kwargs["impl"]) for g in layer.gates],
            rewritten=list(layer.rewritten)))
    return dict(layers=layers, names={n.name for n in gm.graph.nodes}, foldable=a.foldable, blockers=list(a.blockers), skip_reason=a.skip_reason,
                marker=a.marker.name if a.marker is not None else None,
                marker_target=a.marker.target if a.marker is not None else None,
                parents=a.parents.name if a.parents is not None else None,
                parents_op=a.parents.op if a.parents is not None else None)


def _output(res):
    return res[0] if isinstance(res, (tuple, list)) else res


@functools.lru_cache(maxsize=None)
def run_pipeline(family: str = "fast-dllm-v2", layers: int = 2, gate: str = "layer", pack: bool = True,
                 kernels: str = "torch", fused: bool = True) -> Run:
    spec = ModelSpec(family=family, layers=layers, seed=4, fused=fused)
    model = spec.build()
    cache = make_cache(model, seed=3)
    tokens, parents = make_tree(model, 6, "realistic", 7)
    settings = SpecFoldSettings(tau=TAU, gate=gate, pack=pack, kernels=kernels)
    gm, example_inputs = capture_graph(model, tokens, parents, cache)
    stages = {}
    plan = None
    for name, fn in passes.PIPELINE:
        before, code_before = count(gm), gm.code
        if name == "find_regions":
            plan = fn(gm, settings)
        else:
            gm, plan = fn(gm, plan, settings)
        gm.graph.lint()
        out, masks = None, []
        if kernels == "torch":
            with collect_stats() as s:
                out = _output(gm(*example_inputs))
            masks = s.fold_masks
        stages[name] = Stage(name, before, count(gm), code_before, gm.code, out, masks, snapshot(gm, plan))
    return Run(spec, settings, model, (tokens, parents, cache), example_inputs, gm, plan, stages,
               model(tokens, parents, cache))


CONFIGS = [dict(family="fast-dllm-v2", gate="layer"), dict(family="nld", gate="sublayer"),
           dict(family="nld", layers=3, gate="layer", pack=False), dict(family="fast-dllm-v2", fused=False)]
CONFIG_IDS = ["fast-layer", "nld-sublayer", "nld3-nopack", "fast-unfused"]


@pytest.fixture(params=CONFIGS, ids=CONFIG_IDS)
def run(request) -> Run:
    return run_pipeline(**request.param)


def test_pipeline_order():
    assert PASS_NAMES == ["find_regions", "insert_gates", "pack_regions", "fold_attention", "lower_kernels",
                          "strip_marker"]


def test_find_regions_changes_nothing_and_finds_layers(run):
    st = run.stages["find_regions"]
    assert st.code_before == st.code_after and st.before == st.after
    a = st.snap
    assert a["foldable"] and not a["blockers"] and a["skip_reason"] is None
    assert len(a["layers"]) == run.n_layers
    assert a["marker_target"] is MARKER and a["parents_op"] == "placeholder"
    prefix = "model.layers" if run.spec.family == "fast-dllm-v2" else "encoder.layers"
    prev_out = a["marker"]
    seen: set = set()
    for i, layer in enumerate(a["layers"]):
        assert layer["index"] == i and layer["name"] == f"{prefix}.{i}"
        assert layer["h_in"] == prev_out  # the residual stream chains the layers
        prev_out = layer["h_out"]
        assert layer["attention"] is ATTN
        assert len(layer["pre"]) == pre_attention_ops(run.spec.family, run.spec.fused)
        assert len(layer["mlp"]) == mlp_ops(run.spec.fused)
        # q, k, v / gate, up, down (fused: qkv / gate_up, down)
        assert (layer["pre_linears"], layer["mlp_linears"]) == layer_linears(run.spec.fused)
        assert layer["pre_rsqrt"] == 1
        assert layer["h_mid_target"] in T.RESIDUAL_ADDS and layer["h_out_target"] in T.RESIDUAL_ADDS
        region = set(layer["pre"]) | set(layer["mlp"])
        assert not region & seen
        seen |= region
        assert layer["gates"] == [] and layer["rewritten"] == []
    assert st.after[ATTN] == run.n_layers


def test_insert_gates_adds_one_gate_per_layer_or_sublayer(run):
    st = run.stages["insert_gates"]
    assert diff(st.before, st.after) == {GATE: run.n_gates, torch.full: 1}
    tau = next(n for n in run.gm.graph.nodes if n.name == TAU_NODE)
    assert tau.target is torch.full and tau.kwargs["dtype"] == torch.float32 and tau.args[1] == pytest.approx(TAU)
    assert tau.meta["specfold"] == {"region": "graph", "role": "tau"}
    layers = st.snap["layers"]
    gates = [g for layer in layers for g in layer["gates"]]
    assert [g[3] for g in gates] == list(range(run.n_gates))
    for layer in layers:
        states = [layer["h_in"]] + ([layer["h_mid"]] if run.settings.gate == "sublayer" else [])
        assert [g[0] for g in layer["gates"]] == states
        for g in layer["gates"]:
            assert g[1] == st.snap["parents"] and g[2] == "call_function" and g[4] is run.settings.pack
            assert g[5] == "torch"
    # Gates computed, nothing used yet: still the dense forward; the gates report.
    assert_close(st.out, run.dense, tol=1e-6, what="after insert_gates")
    assert len(st.masks) == run.n_gates


def test_pack_regions_packs_and_removes_region_ops(run):
    st = run.stages["pack_regions"]
    L, G = run.n_layers, run.n_gates
    d = diff(st.before, st.after)
    assert d.pop(fold_ops.pack_rows) == 2 * L  # pre-attention and MLP region entries
    assert d.pop(fold_ops.unpack_rows) == 4 * L  # q, k, v and the MLP output
    assert d.pop(fold_ops.pack_external) == PACKED_EXTERNALS[run.spec.family] * L
    assert d.pop(operator.getitem) == 3 * G  # rows, count, slot of every gate
    assert d.pop("Tensor.size") == G  # R = len(rows) for the packed views
    # (branch, position) of the packed rows, once per layer: only the pre-attention region has
    # position tables (RoPE) to gather.
    assert d.pop(operator.floordiv) == L and d.pop(operator.mod) == L
    assert not d, f"ops added or removed besides the packing: {d}"  # region ops replaced one for one
    assert linears(st.after) == linears(st.before)
    names = st.snap["names"]
    for layer in st.snap["layers"]:
        assert not set(layer["pre"] + layer["mlp"]) & names, "original region ops must be gone"
        assert all(t is fold_ops.unpack_rows for t in layer["attention_inputs"])
    packed = [n for n in names if re.search(r"_packed(_\d+)?$", n)]
    assert len(packed) == L * (pre_attention_ops(run.spec.family, run.spec.fused) + mlp_ops(run.spec.fused))
    assert_close(st.out, run.reference(st.masks), what="after pack_regions (dense attention)")
    assert any(m.any() for m in st.masks)


def test_fold_attention_replaces_every_branch_attention(run):
    st = run.stages["fold_attention"]
    L = run.n_layers
    assert st.before[ATTN] == L
    assert diff(st.before, st.after) == {ATTN: -L, FOLDED: L, fold_ops.unpack_rows: -3 * L}
    for layer in st.snap["layers"]:
        assert layer["attention"] is FOLDED
        assert all(t is not fold_ops.unpack_rows for t in layer["attention_inputs"])
    assert_close(st.out, run.reference(st.masks), what="after fold_attention")


def test_lower_kernels_makes_packed_linears(run):
    st = run.stages["lower_kernels"]
    L = run.n_layers
    d = diff(st.before, st.after)
    # silu(gate) * up of every packed MLP becomes one count-aware op (count_aware_swiglu, default on)
    assert d.pop(SILU_MUL) == L and d.pop(F.silu) == -L and d.pop(operator.mul) == -L
    packed = L * sum(layer_linears(run.spec.fused))
    assert d.pop(PACKED_LINEAR) == packed
    assert set(d) <= set(LINEARS) and sum(d.values()) == -packed, d
    assert linears(st.before) - linears(st.after) == packed
    # What is left unpacked: o_proj in every layer and the LM head.
    assert linears(st.after) == L + 1
    for node in run.gm.graph.nodes:
        if node.target is PACKED_LINEAR:
            assert (node.kwargs["dense_fraction"], node.kwargs["impl"], node.kwargs["min_spill_us"]) == \
                (SpecFoldSettings().dense_fraction, "torch", SpecFoldSettings().min_spill_us)
        if node.target in (GATE, FOLDED, PACKED_LINEAR, SILU_MUL):
            assert not node.args and node.kwargs["impl"] == "torch"  # fold ops: keyword arguments only
    assert_close(st.out, run.reference(st.masks), what="after lower_kernels")


def test_strip_marker_removes_only_the_marker(run):
    st = run.stages["strip_marker"]
    assert diff(st.before, st.after) == {MARKER: -1}
    assert "specfold.branches" not in st.code_after
    assert_close(st.out, run.reference(st.masks), what="after strip_marker")
    # The last stage is what compile_graph would run.
    assert torch.equal(st.out, run.stages["lower_kernels"].out)


@pytest.mark.parametrize("kernels, impl", [("triton", "triton"), ("auto", "torch")])
def test_lower_kernels_impl_choice(kernels, impl):
    run = run_pipeline(family="fast-dllm-v2", layers=1, kernels=kernels)  # not executed: choice only
    fold_op_targets = (GATE, FOLDED, PACKED_LINEAR, SILU_MUL)
    impls = [n.kwargs["impl"] for n in run.gm.graph.nodes if n.target in fold_op_targets]
    assert len(impls) == 1 + 1 + sum(layer_linears(fused=True)) + 1 and set(impls) == {impl}
    assert f"kernels={impl}" in run.plan.layers[0].rewritten[-1]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_count_aware_swiglu_switch(fused):
    """count_aware_swiglu=False keeps Inductor's silu * mul; both give the folded reference's output."""
    outs = {}
    for on in (True, False):
        model = ModelSpec(family="fast-dllm-v2", layers=2, seed=5, fused=fused).build()
        cache = make_cache(model, seed=3)
        tokens, parents = make_tree(model, 5, "realistic", 2)
        gm, inputs = capture_graph(model, tokens, parents, cache)
        before = count(gm)
        rewrite = run_passes(gm, SpecFoldSettings(tau=TAU, count_aware_swiglu=on))
        gm = rewrite.gm
        d = diff(before, count(gm))
        assert d.get(SILU_MUL, 0) == (2 if on else 0)
        assert d.get(F.silu, 0) == (-2 if on else 0) and d.get(operator.mul, 0) == (-2 if on else 0)
        assert ("1 packed SwiGLU" in rewrite.plan.layers[0].rewritten[-1]) == on
        with collect_stats() as s:
            outs[on] = _output(gm(*inputs))
        assert_close(outs[on], folded_verify(model, tokens, parents, cache, TAU, fold_masks=s.fold_masks)[0])


def test_attention_correction_off_keeps_branch_attention():
    model = ModelSpec(family="nld", layers=2, seed=4).build()
    cache = make_cache(model, seed=3)
    tokens, parents = make_tree(model, 5, "realistic", 2)
    gm, inputs = capture_graph(model, tokens, parents, cache)
    before = count(gm)
    gm = compile_graph(gm, SpecFoldSettings(tau=TAU, attention_correction=False))
    after = count(gm)
    assert after[ATTN] == 2 and after[FOLDED] == 0 and after[GATE] == 2
    assert after[fold_ops.unpack_rows] == 4 * 2 and after[PACKED_LINEAR] == 2 * sum(layer_linears(fused=True))
    assert after[MARKER] == 0 and before[MARKER] == 1
    with collect_stats() as s:
        out = _output(gm(*inputs))
    ref = folded_verify(model, tokens, parents, cache, TAU, fold_masks=s.fold_masks)[0]
    assert_close(out, ref)


@pytest.mark.parametrize("n_rows, options", [(3, {"fold": False}), (1, {})], ids=["fold-off", "one-branch"])
def test_only_the_marker_is_stripped(n_rows, options):
    # fold=False (the bisection switch), or N = 1 (specialised by torch.compile): nothing can fold, so no
    # gate, packing or kernel is added.
    model = ModelSpec(family="fast-dllm-v2", layers=2, seed=4).build()
    cache = make_cache(model, seed=3)
    tokens, parents = make_tree(model, n_rows, "random", 2)
    gm, inputs = capture_graph(model, tokens, parents, cache)
    before = count(gm)
    rewrite = run_passes(gm, SpecFoldSettings(tau=TAU, **options))
    gm = rewrite.gm
    assert diff(before, count(gm)) == {MARKER: -1}
    if n_rows == 1:
        assert "N = 1" in rewrite.plan.skip_reason and not rewrite.plan.foldable
    assert_close(_output(gm(*inputs)), model(tokens, parents, cache), tol=1e-6)


def test_passes_leave_a_graph_without_marker_alone():
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    gm, inputs = capture_graph(lin, x)
    code, before = gm.code, count(gm)
    settings = SpecFoldSettings(tau=TAU)
    plan = passes.find_regions(gm, settings)
    for name, fn in passes.REWRITES:
        gm, plan = fn(gm, plan, settings)
        assert gm.code == code and count(gm) == before, name
    assert plan.skip_reason and not plan.blockers
    assert torch.equal(_output(gm(*inputs)), lin(x))


def test_ops_table_has_the_model_ops():
    # Guards against silently losing a target the models emit (they would become blockers).
    for fn in (torch.rsqrt, operator.mul, operator.add, F.silu):
        assert fn in T.ELEMENTWISE_FUNCTIONS
    assert F.linear in T.LINEAR_FUNCTIONS
