"""Shared helpers of the backend and pass tests: tiny random models, draft trees, compile-and-run.

Imported as a plain module (tests/backend is put on sys.path by its conftest; tests/passes' conftest
does the same), so the name is unique across the test tree.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch._dynamo
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from specfold_compile import reference
from specfold_compile.backend import collect_stats
from specfold_compile.kernels.gate_ref import fold_flags_ref
from specfold_compile.models import build

FAMILIES = {"fast-dllm-v2": "tiny-fast-dllm-v2", "nld": "tiny-nld"}
VOCAB = 128
RTOL = 1e-5  # fp32: ||out - ref|| / ||ref||

# Hypothesis: every example compiles a model (about a second on CPU); keep counts small.
HSETTINGS = dict(deadline=None, database=None, print_blob=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                        HealthCheck.data_too_large])


def hsettings(n: int):
    return settings(max_examples=n, **HSETTINGS)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach(), ref.detach()
    den = torch.linalg.vector_norm(ref.double())
    return float(torch.linalg.vector_norm((out.double() - ref.double())) / den) if den > 0 else \
        float(torch.linalg.vector_norm(out.double()))


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float = RTOL, what: str = "") -> None:
    assert out.shape == ref.shape, (what, out.shape, ref.shape)
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    err = rel_err(out, ref)
    assert err < tol, f"{what}: relative error {err:.3e} >= {tol:.0e}"


# --- models --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSpec:
    family: str = "fast-dllm-v2"
    layers: int = 2
    hidden: int = 48
    kv_heads: int = 2
    group: int = 2  # q heads per kv head (1 = MHA)
    head_dim: int = 16
    bias: bool = True
    block: int = 16
    seed: int = 0
    fused: bool = True  # q/k/v and gate/up as one linear each (the models' default)

    @property
    def heads(self) -> int:
        return self.kv_heads * self.group

    def build(self):
        return build(FAMILIES[self.family], seed=self.seed, num_layers=self.layers, hidden_size=self.hidden,
                     num_heads=self.heads, num_kv_heads=self.kv_heads, head_dim=self.head_dim,
                     intermediate_size=2 * self.hidden, attention_bias=self.bias, block_size=self.block,
                     sub_block_size=8 if self.family == "fast-dllm-v2" else None, fuse_projections=self.fused)


@st.composite
def model_specs(draw, max_layers: int = 3) -> ModelSpec:
    """1-3 layers, hidden 32-128, MHA and GQA, head_dim mostly != hidden/heads, bias on/off, both families."""
    family = draw(st.sampled_from(sorted(FAMILIES)))
    hidden = draw(st.sampled_from([32, 48, 64, 96, 128]))
    kv_heads = draw(st.sampled_from([1, 2, 4]))
    group = draw(st.sampled_from([1, 2]))
    head_dim = draw(st.sampled_from([8, 12, 16, 32]))
    return ModelSpec(family=family, layers=draw(st.integers(1, max_layers)), hidden=hidden, kv_heads=kv_heads,
                     group=group, head_dim=head_dim, bias=draw(st.booleans()),
                     block=draw(st.sampled_from([8, 16])), seed=draw(st.integers(0, 2**16)))


def make_cache(model, prompt_len: int = 7, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB - 1, (prompt_len,), generator=g)
    return model.prefill(ids)


# --- draft trees ---------------------------------------------------------------------------------

def realistic_tree(model, n_rows: int, seed: int, max_changes: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Spiffy-like drafts: the main row is a partly decoded block (a few tokens, the rest masked); every
    draft equals its parent except for 1..max_changes masked positions that it commits."""
    g = torch.Generator().manual_seed(seed)
    block, mask = model.config.block_size, model.config.mask_token_id

    def draw(k: int) -> torch.Tensor:
        t = torch.randint(0, VOCAB - 1, (k,), generator=g)
        return torch.where(t == mask, (mask + 1) % VOCAB, t)

    main = torch.full((block,), mask, dtype=torch.int64)
    decoded = int(torch.randint(1, block // 2 + 1, (1,), generator=g))
    main[:decoded] = draw(decoded)
    rows, parents = [main], [-1]
    for n in range(1, n_rows):
        p = int(torch.randint(0, n, (1,), generator=g))
        row = rows[p].clone()
        masked = torch.nonzero(row == mask).flatten()
        if masked.numel():
            k = int(torch.randint(1, max_changes + 1, (1,), generator=g))
            pick = masked[torch.randperm(masked.numel(), generator=g)[:k]]
            row[pick] = draw(pick.numel())
        rows.append(row)
        parents.append(p)
    return torch.stack(rows), torch.tensor(parents, dtype=torch.int64)


def random_tree(model, n_rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    block = model.config.block_size
    tokens = torch.randint(0, VOCAB, (n_rows, block), generator=g)
    parents = [-1] + [int(torch.randint(0, n, (1,), generator=g)) for n in range(1, n_rows)]
    return tokens, torch.tensor(parents, dtype=torch.int64)


def make_tree(model, n_rows: int, kind: str, seed: int):
    return realistic_tree(model, n_rows, seed) if kind == "realistic" else random_tree(model, n_rows, seed)


# --- compile and run -----------------------------------------------------------------------------

def root_cause(exc: BaseException) -> BaseException:
    """Dynamo wraps every backend exception in BackendCompilerFailed (``inner_exception``)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "inner_exception", None) or exc.__cause__
        if inner is None:
            break
        exc = inner
    return exc


def gates_per_call(model, options: dict) -> int:
    if not options.get("fold", True):
        return 0
    return len(model.layers) * (2 if options.get("gate", "layer") == "sublayer" else 1)


def capture_graph(model, *args):
    """The Dynamo graph of ``model(*args)`` (a fresh trace) and its example inputs, before any pass."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(*args)
    assert len(graphs) == 1, "the verification forward must be one graph"
    return graphs[0]


def compile_run(model, tokens, parents, cache, reset: bool = True, **options):
    """Fresh ``torch.compile(model, backend="specfold", options=options)``, one call under collect_stats.

    Asserts that the folded graph really ran (the gates reported): a test of a compiled model that
    silently ran eager would otherwise pass trivially. With one branch (N = 1) nothing can fold and the
    backend runs the plain graph: then no gate may report.
    """
    if reset:
        torch._dynamo.reset()
    compiled = torch.compile(model, backend="specfold", options=options)
    with collect_stats() as s:
        out = compiled(tokens, parents, cache)
    expected = gates_per_call(model, options) if tokens.shape[0] > 1 else 0
    assert len(s.fold_masks) == expected, f"{len(s.fold_masks)} gates ran, expected {expected}"
    assert s.calls == (1 if expected else 0)
    return out, s, compiled


@contextlib.contextmanager
def recording_reference_gates():
    """Record the residual stream the reference evaluates (or forces) every gate on: list of (h, parents)."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    orig = reference._gate

    def gate(h, parents, tau, forced):
        seen.append((h.detach().clone(), parents.clone()))
        return orig(h, parents, tau, forced)

    reference._gate = gate
    try:
        yield seen
    finally:
        reference._gate = orig


def relative_residual(h: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """||h[n] - h[p]|| / ||h[p]|| per (n, b) (row 0: nan), float64 for an exact comparison with tau."""
    hf = h.double()
    out = torch.full(h.shape[:2], float("nan"), dtype=torch.float64)
    if h.shape[0] > 1:
        hp = hf[parents[1:]]
        out[1:] = torch.linalg.vector_norm(hf[1:] - hp, dim=-1) / torch.linalg.vector_norm(hp, dim=-1)
    return out


def check_gates_near_threshold(masks, states, tau: float, slack: float = 1e-5) -> int:
    """The compiled gates ``masks`` against the SPEC gate evaluated on the reference's residual streams
    ``states`` (the reference run with the same forced masks): rows may only disagree where the relative
    residual lies within ``slack`` of tau. Returns the number of disagreeing rows."""
    assert len(masks) == len(states)
    disagree = 0
    for i, (mask, (h, parents)) in enumerate(zip(masks, states)):
        ref = fold_flags_ref(h, parents, torch.tensor(tau))
        bad = mask.cpu() != ref.cpu()
        if bad.any():
            r = relative_residual(h, parents)[bad]
            assert torch.all((r - tau).abs() <= slack), \
                f"gate {i}: {int(bad.sum())} rows disagree away from the threshold (residuals {r.tolist()})"
            disagree += int(bad.sum())
    return disagree


def expected_layer0_mask(tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """At the first gate the residual stream is the embedding: a draft position folds exactly when its token
    equals its parent's (for 0 < tau < 1 and random embeddings)."""
    m = torch.zeros(tokens.shape, dtype=torch.bool)
    m[1:] = tokens[1:] == tokens[parents[1:]]
    return m


def chain_lengths_of(mask: torch.Tensor, parents: torch.Tensor) -> dict[int, int]:
    """Independent count: for a folded row, the number of folds followed to reach a computed row."""
    out: dict[int, int] = {}
    n_rows, block = mask.shape
    for n in range(1, n_rows):
        for b in range(block):
            if not mask[n, b]:
                continue
            length, cur = 0, n
            while cur != 0 and mask[cur, b]:
                length += 1
                cur = int(parents[cur])
            out[length] = out.get(length, 0) + 1
    return dict(sorted(out.items()))


def finite(x: float) -> bool:
    return not math.isnan(x)
