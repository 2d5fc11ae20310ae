"""Options, dumps, fallback / strict mode and the entry-point registration of ``backend="specfold"``."""
import math
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

from specfold_compile.testing import ModelSpec, assert_close, capture_graph, compile_run, make_cache, make_tree, root_cause
from specfold_compile import ops
from specfold_compile.backend import SpecFoldError, SpecFoldSettings, collect_stats, compile_graph
from specfold_compile.passes import REWRITES, find_regions


def _compile_error(model, args, options) -> BaseException:
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(model, backend="specfold", options=options)(*args)
    return root_cause(info.value)


@pytest.fixture(scope="module")
def tiny():
    model = ModelSpec(family="fast-dllm-v2", layers=2, seed=1).build()
    cache = make_cache(model)
    tokens, parents = make_tree(model, 4, "realistic", 3)
    return model, tokens, parents, cache


# --- options ---------------------------------------------------------------------------------------

def test_unknown_option_lists_valid_ones(tiny):
    with pytest.raises(ValueError) as info:
        SpecFoldSettings.from_options({"tua": 0.1})
    msg = str(info.value)
    assert "tua" in msg
    for name in ("tau", "gate", "kernels", "strict", "dump_dir", "fold", "pack", "attention_correction"):
        assert name in msg
    model, tokens, parents, cache = tiny
    err = _compile_error(model, (tokens, parents, cache), {"tua": 0.1})
    assert isinstance(err, ValueError) and "tua" in str(err) and "attention_correction" in str(err)


@pytest.mark.parametrize("options, name", [
    ({"tau": -0.1}, "tau"), ({"tau": float("nan")}, "tau"), ({"tau": -math.inf}, "tau"), ({"tau": "abc"}, "tau"),
    ({"tau": None}, "tau"), ({"tau": True}, "tau"), ({"gate": "mlp"}, "gate"), ({"gate": None}, "gate"), ({"kernels": "cuda"}, "kernels"),
    ({"strict": 1}, "strict"), ({"fold": "yes"}, "fold"), ({"pack": None}, "pack"),
    ({"attention_correction": 0}, "attention_correction"), ({"inductor": "yes"}, "inductor"),
    ({"dense_fraction": 1.5}, "dense_fraction"), ({"dense_fraction": -0.1}, "dense_fraction"),
    ({"dense_fraction": "half"}, "dense_fraction"), ({"dense_fraction": True}, "dense_fraction"),
    ({"gate_flags": "inductor"}, "gate_flags"), ({"gate_flags": None}, "gate_flags"),
    ({"min_spill_us": -1}, "min_spill_us"), ({"min_spill_us": math.inf}, "min_spill_us"),
    ({"min_spill_us": float("nan")}, "min_spill_us"), ({"min_spill_us": "2"}, "min_spill_us"),
    ({"fold_min_branches": 0}, "fold_min_branches"), ({"fold_min_branches": 2.5}, "fold_min_branches"),
    ({"fold_min_branches": True}, "fold_min_branches"), ({"fold_min_branches": "auto"}, "fold_min_branches"),
    ({"combo_kernels": "yes"}, "combo_kernels"), ({"combo_kernels": 1}, "combo_kernels"),
])
def test_bad_option_values_name_the_option(options, name):
    with pytest.raises((ValueError, TypeError)) as info:
        SpecFoldSettings.from_options(options)
    assert f"options[{name!r}]" in str(info.value), str(info.value)


def test_inductor_auto_and_dense_fraction_defaults():
    s = SpecFoldSettings.from_options({})
    assert s.inductor is None and s.dense_fraction == 0.45 and s.min_spill_us == 2.0 and s.fold_min_branches is None
    assert SpecFoldSettings.from_options({"min_spill_us": 0}).min_spill_us == 0.0
    assert SpecFoldSettings.from_options({"fold_min_branches": 9}).fold_min_branches == 9
    assert SpecFoldSettings.from_options({"inductor": False, "dense_fraction": 1}).dense_fraction == 1.0


def test_bad_option_through_torch_compile(tiny):
    model, tokens, parents, cache = tiny
    for options, name in (({"tau": -1.0}, "tau"), ({"gate": "x"}, "gate"), ({"kernels": "x"}, "kernels")):
        err = _compile_error(model, (tokens, parents, cache), options)
        assert isinstance(err, ValueError) and f"options[{name!r}]" in str(err)


def test_valid_options_are_normalised():
    s = SpecFoldSettings.from_options({"tau": 1, "gate": "sublayer", "kernels": "torch"})
    assert s.tau == 1.0 and isinstance(s.tau, float)
    assert SpecFoldSettings.from_options(None) == SpecFoldSettings.from_options({})
    assert SpecFoldSettings.from_options({"tau": 0}).tau == 0.0


def test_fold_false_gives_dense_result(tiny):
    model, tokens, parents, cache = tiny
    out, s, _ = compile_run(model, tokens, parents, cache, tau=0.5, fold=False)
    assert s.fold_masks == []
    assert_close(out, model(tokens, parents, cache), tol=1e-6, what="fold=False")


# --- dumps -----------------------------------------------------------------------------------------

REWRITE_NAMES = [name for name, _ in REWRITES]


def _expected_dump_files(rewrites=REWRITE_NAMES):
    """The files of one graph's dump folder: the input, every rewrite but the last, the final graph."""
    steps = ["input"] + list(rewrites[:-1]) + ["final"]
    return {f"{i:02d}_{name}.py" for i, name in enumerate(steps)} | {"regions.txt"}


def _files(folder):
    return {p.name for p in folder.iterdir()}


def test_dump_dir_writes_every_pass_and_report(tiny, tmp_path):
    model, tokens, parents, cache = tiny
    compile_run(model, tokens, parents, cache, tau=0.3, dump_dir=str(tmp_path))
    assert _files(tmp_path) == {"graph_00"}
    graph = tmp_path / "graph_00"
    assert _files(graph) == _expected_dump_files(), sorted(_files(graph))
    for p in graph.glob("*.py"):
        assert "def forward" in p.read_text()
    assert "specfold.branches" in (graph / "00_input.py").read_text()
    final = (graph / f"{len(REWRITE_NAMES):02d}_final.py").read_text()
    assert "specfold.branches" not in final and "specfold.fold_gate" in final
    assert final.startswith("# graph ") and "after strip_marker, the graph that runs" in final.splitlines()[0]
    # inserted nodes are listed with their region and role
    annotations = final[final.index("# nodes inserted by specfold"):]
    assert "fold_gate_default: layer 0, gate" in annotations and "layer 1, packed_linear" in annotations
    assert "specfold_tau: graph, tau" in annotations
    assert "nodes inserted" not in (graph / "00_input.py").read_text()
    report = (graph / "regions.txt").read_text()
    assert "decoder layers found: 2" in report and "blocker" not in report
    assert len(re.findall(r"layer \d .*rewritten: .*folded attention", report)) == 2
    # A second graph in the same directory gets its own folder instead of overwriting.
    torch._dynamo.reset()
    compile_run(model, tokens[:2], parents[:2], cache, tau=0.3, dump_dir=str(tmp_path))
    assert _files(tmp_path) == {"graph_00", "graph_01"}
    assert _files(tmp_path / "graph_01") == _expected_dump_files()


def test_dump_dir_from_environment(tiny, tmp_path, monkeypatch):
    model, tokens, parents, cache = tiny
    monkeypatch.setenv("SPECFOLD_DUMP_DIR", str(tmp_path / "env"))
    compile_run(model, tokens, parents, cache, tau=0.3)
    assert _files(tmp_path / "env" / "graph_00") == _expected_dump_files()
    # An explicit option wins over the environment.
    torch._dynamo.reset()
    compile_run(model, tokens, parents, cache, tau=0.3, dump_dir=str(tmp_path / "opt"))
    assert (tmp_path / "opt" / "graph_00" / "regions.txt").is_file()
    assert _files(tmp_path / "env") == {"graph_00"}


def test_dump_with_fold_false(tiny, tmp_path):
    model, tokens, parents, cache = tiny
    compile_run(model, tokens, parents, cache, fold=False, dump_dir=str(tmp_path))
    assert _files(tmp_path / "graph_00") == {"00_input.py", "01_final.py", "regions.txt"}


# --- fallback and strict mode ----------------------------------------------------------------------

class TinyVerifier(nn.Module):
    """A hand-written verification model built on the marker and attention ops, with an optional op in
    the pre-attention region that mixes positions."""

    def __init__(self, bad: str | None, layers: int = 2, channels: int = 16, heads: int = 2, head_dim: int = 8):
        super().__init__()
        torch.manual_seed(0)
        self.bad, self.heads, self.head_dim = bad, heads, head_dim
        self.emb = nn.Embedding(32, channels)
        hd = heads * head_dim
        self.q = nn.ModuleList(nn.Linear(channels, hd) for _ in range(layers))
        self.k = nn.ModuleList(nn.Linear(channels, hd) for _ in range(layers))
        self.v = nn.ModuleList(nn.Linear(channels, hd) for _ in range(layers))
        self.o = nn.ModuleList(nn.Linear(hd, channels) for _ in range(layers))
        self.up = nn.ModuleList(nn.Linear(channels, 2 * channels) for _ in range(layers))
        self.down = nn.ModuleList(nn.Linear(2 * channels, channels) for _ in range(layers))

    def forward(self, tokens, parents, k_pre, v_pre):
        h = ops.mark_branches(self.emb(tokens), parents)
        n, b, _ = h.shape
        for i in range(len(self.q)):
            x = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            if self.bad == "cumsum":
                x = torch.cumsum(x, dim=1)
            elif self.bad == "softmax":
                x = x * torch.softmax(x, dim=1)
            q = self.q[i](x).view(n, b, self.heads, self.head_dim)
            k = self.k[i](x).view(n, b, self.heads, self.head_dim)
            v = self.v[i](x).view(n, b, self.heads, self.head_dim)
            o = ops.branch_attention(q, k, v, k_pre, v_pre, self.head_dim ** -0.5)
            h = h + self.o[i](o.reshape(n, b, -1))
            h = h + self.down[i](F.silu(self.up[i](h)))
        return h


def _verifier_inputs():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 32, (3, 8), generator=g)
    tokens[1] = tokens[0]
    tokens[1, 2] = 5
    return tokens, torch.tensor([-1, 0, 1]), torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)


def _specfold_warnings(record):
    return [w for w in record if "specfold" in str(w.message)]


def test_graph_without_marker_runs_unchanged():
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = torch.compile(lin, backend="specfold", options={"strict": True})(x)
    assert not _specfold_warnings(record)
    assert torch.equal(out, lin(x))


def test_prefill_path_runs_unchanged(tiny):
    model, *_ = tiny
    ids = torch.tensor([1, 2, 3, 4, 5], dtype=torch.int64)
    fn = torch.compile(model._sequence, backend="specfold", options={"strict": True})
    positions = torch.arange(5)
    allowed = torch.ones(1, 5, 5, dtype=torch.bool).tril()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        h, keys, _ = fn(ids[None], positions, allowed, None)
    assert not _specfold_warnings(record)
    h_ref, keys_ref, _ = model._sequence(ids[None], positions, allowed, None)
    assert_close(h, h_ref, tol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(keys, keys_ref))


def test_supported_hand_written_model_folds():
    model = TinyVerifier(None)
    args = _verifier_inputs()
    gm, _ = capture_graph(model, *args)
    analysis = find_regions(gm, SpecFoldSettings())
    assert analysis.foldable and len(analysis.layers) == 2, analysis.blockers
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as record, collect_stats() as s:
        warnings.simplefilter("always")
        out = torch.compile(model, backend="specfold", options={"tau": 0.0, "strict": True})(*args)
    assert not _specfold_warnings(record)
    assert len(s.fold_masks) == 2
    assert_close(out, model(*args))


@pytest.mark.parametrize("bad, op", [("cumsum", "cumsum"), ("softmax", "softmax")])
def test_unsupported_op_falls_back_with_one_warning(bad, op):
    model = TinyVerifier(bad)
    args = _verifier_inputs()
    gm, _ = capture_graph(model, *args)
    blockers = find_regions(gm, SpecFoldSettings()).blockers
    assert len(blockers) == 2 and {b.layer for b in blockers} == {0, 1}
    assert all(b.kind == "unsupported_op" and op in str(b) for b in blockers)

    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as record, collect_stats() as s:
        warnings.simplefilter("always")
        compiled = torch.compile(model, backend="specfold", options={"tau": 0.5})
        out = compiled(*args)
        out2 = compiled(*args)  # no recompilation, no second warning
    found = _specfold_warnings(record)
    assert len(found) == 1, [str(w.message) for w in found]
    message = str(found[0].message)
    for b in blockers:
        assert str(b) in message
    assert s.fold_masks == []  # nothing folded, not even at tau = 0.5
    expected = model(*args)
    assert_close(out, expected, tol=1e-6)
    assert torch.equal(out, out2)

    err = _compile_error(model, args, {"strict": True})
    assert isinstance(err, SpecFoldError), type(err)
    assert [str(b) for b in err.blockers] == [str(b) for b in blockers]
    for b in blockers:
        assert str(b) in str(err)


def test_strict_error_from_compile_graph(tmp_path):
    model = TinyVerifier("cumsum")
    gm, _ = capture_graph(model, *_verifier_inputs())
    with pytest.raises(SpecFoldError) as info:
        compile_graph(gm, SpecFoldSettings(strict=True, dump_dir=str(tmp_path)))
    assert len(info.value.blockers) == 2
    report = (tmp_path / "graph_00" / "regions.txt").read_text()
    assert all(f"blocker: {b}" in report for b in info.value.blockers)


# --- entry point -----------------------------------------------------------------------------------

ENTRY_POINT_SCRIPT = textwrap.dedent("""
    import importlib, sys, torch, torch._dynamo
    from torch._dynamo.backends import registry
    assert not any(m.startswith("specfold_compile") for m in sys.modules), "imported too early"
    assert "specfold" in torch._dynamo.list_backends(), torch._dynamo.list_backends()
    assert not any(m.startswith("specfold_compile") for m in sys.modules), "listing imported the package"
    fn = torch._dynamo.lookup_backend("specfold")      # loads the entry point
    import specfold_compile.backend as backend
    assert fn is backend.specfold_backend
    from specfold_compile.models import build
    m = build("tiny-nld", seed=0, num_layers=1, block_size=8)
    cache = m.prefill(torch.tensor([1, 2, 3], dtype=torch.int64))
    toks = torch.randint(0, 100, (2, 8)); toks[1] = toks[0]; toks[1, 3] = 7
    parents = torch.tensor([-1, 0])
    with backend.collect_stats() as s:
        out = torch.compile(m, backend="specfold", options={"tau": 0.0})(toks, parents, cache)
    assert len(s.fold_masks) == 1, "the specfold backend did not run"
    assert torch.allclose(out, m(toks, parents, cache), rtol=1e-4, atol=1e-5)
    print("ENTRY_POINT_OK")
    # Only the entry point registers the name: forget it, re-execute the package's backend module, and
    # the name stays unknown.
    registry._COMPILER_FNS.pop("specfold"); registry._BACKENDS.pop("specfold")
    importlib.reload(backend)
    assert "specfold" not in registry._COMPILER_FNS and "specfold" not in registry._BACKENDS
    try:
        torch._dynamo.lookup_backend("specfold")
    except Exception as e:
        print("NOT_REGISTERED_BY_IMPORT", type(e).__name__)
""")


def test_entry_point_registers_backend_without_import():
    res = subprocess.run([sys.executable, "-c", ENTRY_POINT_SCRIPT], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ENTRY_POINT_OK" in res.stdout
    assert "NOT_REGISTERED_BY_IMPORT InvalidBackend" in res.stdout


def test_backend_name_registered_without_the_entry_point():
    """``backend="specfold"`` works from a source checkout, where no installed entry point names it:
    importing the package registers it (checked in a process that sees no entry points at all)."""
    import subprocess
    import sys

    code = (
        "import importlib.metadata as md\n"
        "md.entry_points = lambda **kw: md.EntryPoints([])\n"
        "import torch\n"
        "from torch._dynamo.backends.registry import lookup_backend\n"
        "import specfold_compile\n"
        "from specfold_compile.backend import specfold_backend\n"
        "assert lookup_backend('specfold') is specfold_backend\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
