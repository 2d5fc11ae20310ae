"""Helpers of the test suite and of the kernel benchmarks' checks; the package itself never imports this.

``tests/`` and ``bench/kernels/`` take every shared helper from here (``tests/conftest.py`` configures the
run): comparisons (``rel_err``, the one error measure; ``assert_close``, ``tol``), kernel inputs on
``DEVICE`` (``randn``, ``strided_q``, ``cache_view``, ``packed_problem``, ``attention_tuning``), tiny
random models and draft trees (``ModelSpec``, ``make_cache``, ``identity_head``, ``make_tree``; the hypothesis helpers
``model_specs`` and ``hsettings`` import hypothesis when called), compile-and-run that checks the folded
graph ran (``compile_run``, ``capture_graph``, ``root_cause``), gate checks against the reference
(``recording_reference_gates``, ``check_gates_near_threshold``, ...), ``no_host_reads`` (a guard that
fails on any host read) and the bf16 patch of Triton's CPU
interpreter (``install_interpreter_bf16_patch``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch._dynamo
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from . import reference
from .backend import collect_stats
from .kernels.gate_ref import fold_flags_ref, resolve_folds_ref
from .models import build
from .ops.device_profile import H200

FAMILIES = {"fast-dllm-v2": "tiny-fast-dllm-v2", "nld": "tiny-nld"}
VOCAB = 128
RTOL = 1e-5  # fp32 models: ||out - ref|| / ||ref||
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # where the kernel tests launch
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


# --- comparisons ---------------------------------------------------------------------------------

def rel_err(out: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor | None = None, *,
            ord: float = math.inf) -> float:
    """``||out - ref|| / ||ref||`` in float64 over the entries where ``ref`` is finite (and ``mask``, if
    given, is true). ``ord=math.inf`` (the default): the worst error, ``max |out - ref| / max |ref|``, as
    the kernel benchmarks report it; ``ord=2``: the Euclidean norm, as ``assert_close`` compares models.
    A NaN in ``out`` gives NaN; nothing to compare gives 0.0; where ``ref`` is all zero, the absolute error."""
    out, ref = out.detach().double(), ref.detach().double()
    if mask is not None:
        out, ref = out[mask], ref[mask]
    finite = torch.isfinite(ref)
    out, ref = out[finite], ref[finite]
    if ref.numel() == 0:
        return 0.0
    err = torch.linalg.vector_norm(out - ref, ord)
    den = torch.linalg.vector_norm(ref, ord)
    return float(err / den) if den > 0 else float(err)


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float = RTOL, what: str = "") -> None:
    """Same shape, finite, and ``rel_err(out, ref, ord=2) < tol``; ``what`` names the comparison."""
    assert out.shape == ref.shape, (what, out.shape, ref.shape)
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    assert torch.isfinite(ref).all(), f"{what}: non-finite reference"
    err = rel_err(out, ref, ord=2)
    assert err < tol, f"{what}: relative error {err:.3e} >= {tol:.0e}"


def tol(dtype: torch.dtype) -> dict:
    """``torch.testing.assert_close`` tolerances of a kernel against its float32 PyTorch twin."""
    if dtype == torch.float32:
        return dict(rtol=1e-5, atol=1e-5)
    return dict(rtol=1e-2, atol=1e-2)


# --- kernel inputs -------------------------------------------------------------------------------

def randn(*shape, dtype=torch.float32, gen=None, scale=1.0) -> torch.Tensor:
    """Random normal values, never all zero, in the given dtype on ``DEVICE`` (drawn on the CPU from
    ``gen``, so a seed gives the same values on every machine)."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float32) * scale
    return x.to(device=DEVICE, dtype=dtype)


def attention_tuning(**changes):
    """The H200 profile's attention launch choices, with ``changes`` (the launchers take them as an argument)."""
    return dataclasses.replace(H200.attention, **changes)


ATT = attention_tuning()


def strided_q(R, Hq, D, dtype, gen) -> torch.Tensor:
    """[R, Hq, D] view with a non-trivial row stride (as produced from a [R, 1, Hq, D] buffer
    with extra room), last dim contiguous."""
    buf = randn(R, 1, Hq + 1, D, dtype=dtype, gen=gen)
    return buf[:, 0, 1:, :]


def cache_view(Hkv, P, D, dtype, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """k_pre, v_pre [Hkv, P, D] as strided views of bigger caches, with different strides (the kernels
    must not read v_pre with k_pre's)."""
    cache = randn(2, 2, Hkv, P + 3, D, dtype=dtype, gen=gen)
    v_cache = randn(Hkv + 1, P + 7, D, dtype=dtype, gen=gen)
    return cache[0, 1, :, 2:P + 2], v_cache[1:, 4:P + 4]


def packed_problem(N, B, Hkv, G, D, P, dtype, p_fold, gen):
    """A packed attention problem: random folds (probability ``p_fold``) of N branches of B positions,
    q [R, Hkv * G, D] (strided), k, v [R, Hkv, D] over a packed buffer of R > count rows, the prefix
    ``cache_view`` and the slot map. Returns (q, k, v, k_pre, v_pre, slot)."""
    Hq = Hkv * G
    fold = torch.rand(N, B, generator=gen) < p_fold
    parents = torch.tensor([-1] + [int(torch.randint(0, n, (1,), generator=gen)) for n in range(1, N)])
    _, _, count, slot = resolve_folds_ref(fold, parents)
    R = int(count) + 2  # packed buffer with some unused tail rows
    q = strided_q(R, Hq, D, dtype, gen)
    k = randn(R, Hkv, D, dtype=dtype, gen=gen)
    v = randn(R, Hkv, D, dtype=dtype, gen=gen)
    k_pre, v_pre = cache_view(Hkv, P, D, dtype, gen)
    return q, k, v, k_pre, v_pre, slot.to(DEVICE)


# --- models --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSpec:
    """A tiny random model of one family (float32, CPU); ``build()`` makes it."""
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


def model_specs(max_layers: int = 3):
    """Hypothesis strategy of ``ModelSpec``: 1..max_layers layers, hidden 32-128, MHA and GQA, head_dim
    mostly != hidden/heads, bias on/off, both families."""
    from hypothesis import strategies as st

    @st.composite
    def specs(draw) -> ModelSpec:
        family = draw(st.sampled_from(sorted(FAMILIES)))
        hidden = draw(st.sampled_from([32, 48, 64, 96, 128]))
        kv_heads = draw(st.sampled_from([1, 2, 4]))
        group = draw(st.sampled_from([1, 2]))
        head_dim = draw(st.sampled_from([8, 12, 16, 32]))
        return ModelSpec(family=family, layers=draw(st.integers(1, max_layers)), hidden=hidden,
                         kv_heads=kv_heads, group=group, head_dim=head_dim, bias=draw(st.booleans()),
                         block=draw(st.sampled_from([8, 16])), seed=draw(st.integers(0, 2**16)))

    return specs()


def hsettings(n: int):
    """Hypothesis settings for tests whose every example compiles a model (about a second on the CPU):
    ``n`` examples, no deadline, no example database, the slow-example health checks off."""
    from hypothesis import HealthCheck, settings

    return settings(max_examples=n, deadline=None, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


TINY_FAMILIES = ("tiny-fast-dllm-v2", "tiny-nld")
_TINY_MODELS: dict = {}


def tiny_model(name: str):
    """One seeded tiny model of preset ``name`` for the whole run, shared (hypothesis tests cannot take
    function-scoped fixtures); tests must not change it."""
    from .models import build

    if name not in _TINY_MODELS:
        _TINY_MODELS[name] = build(name, seed=0)
    return _TINY_MODELS[name]


def make_cache(model, prompt_len: int = 7, seed: int = 0):
    """The model's cache after prefilling a random prompt of ``prompt_len`` tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB - 1, (prompt_len,), generator=g)
    return model.prefill(ids)


@contextlib.contextmanager
def identity_head(model):
    """The model's LM head replaced by the identity: its forwards then return the final norm's rows (a
    comparison of hidden states, bit for bit, with no LM head GEMM in between)."""
    model.head = lambda h: h
    try:
        yield
    finally:
        del model.head


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
    """Uniformly random tokens in every row and random parents (rows rarely share tokens)."""
    g = torch.Generator().manual_seed(seed)
    block = model.config.block_size
    tokens = torch.randint(0, VOCAB, (n_rows, block), generator=g)
    parents = [-1] + [int(torch.randint(0, n, (1,), generator=g)) for n in range(1, n_rows)]
    return tokens, torch.tensor(parents, dtype=torch.int64)


def make_tree(model, n_rows: int, kind: str, seed: int):
    """tokens [n_rows, block], parents [n_rows]: ``kind`` "realistic" or "random"."""
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
    """The gates one folded call runs with backend ``options`` (one per layer, two with sublayer gates)."""
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
    backend runs the plain graph: then no gate may report. Returns (output, stats, compiled model).
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


# --- gates ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def recording_reference_gates():
    """Record the residual stream the reference evaluates (or forces) every gate on: list of (h, parents)."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    orig = reference.FoldGates._fold

    def fold(gates, h):
        seen.append((h.detach().clone(), gates.parents.clone()))
        return orig(gates, h)

    reference.FoldGates._fold = fold
    try:
        yield seen
    finally:
        reference.FoldGates._fold = orig


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


# --- Triton's CPU interpreter --------------------------------------------------------------------

_PATCHED = False


def _bf16_bits_to_f32(data: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(data).view(np.int16)
    return torch.from_numpy(bits.copy()).view(torch.bfloat16).float().numpy()


def _to_bf16_bits(data: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(data)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def install_interpreter_bf16_patch() -> bool:
    """Make Triton's CPU interpreter (triton 3.6) compute bf16 as a GPU does; once per process.

    The interpreter stores bf16 as raw uint16 bits: ``tl.dot`` on bf16 operands multiplies the bit
    patterns as integers, and fp32 -> bf16 casts truncate instead of rounding to nearest even. The patch
    of ``InterpreterBuilder`` converts bf16 (and other non-numpy float) dot operands to float32 and routes
    every bf16 <-> float conversion through torch (round to nearest even, subnormals, inf, NaN). For the
    test suite (``tests/conftest.py``) and interpreted benchmark smoke runs only: the package never
    installs it (the kernels refuse bf16 under an unpatched interpreter instead). The names patched are
    triton internals: re-check them when triton moves. Returns True once the patch is active.
    """
    global _PATCHED
    if _PATCHED:
        return True
    import triton.language as tl
    from triton.runtime import interpreter as interp

    builder_cls, TensorHandle = interp.InterpreterBuilder, interp.TensorHandle
    orig_cast, orig_fp_to_fp, orig_dot = builder_cls.cast_impl, builder_cls.create_fp_to_fp, builder_cls.create_dot

    def as_float(handle):
        return _bf16_bits_to_f32(handle.data) if handle.dtype.scalar == tl.bfloat16 else handle.data

    def torch_int(d):
        return {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[d.primitive_bitwidth]

    def bf16_cast(src, dst_type):
        s, d = src.dtype.scalar, dst_type.scalar
        if s == tl.bfloat16 and d == tl.bfloat16:
            return TensorHandle(src.data.copy(), d)
        if s == tl.bfloat16:
            f = _bf16_bits_to_f32(src.data)
            if d.is_floating():
                return TensorHandle(f.astype(interp._get_np_dtype(d)), d)
            return TensorHandle(torch.from_numpy(f).to(torch_int(d)).numpy(), d)
        data = src.data  # d == bf16
        if data.dtype == np.uint16 or data.dtype == np.uint8:
            return None  # fp8 sources: leave to the original implementation
        return TensorHandle(_to_bf16_bits(data.astype(np.float32) if data.dtype != np.float64 else data), d)

    def cast_impl(self, src, dst_type):
        if tl.bfloat16 in (src.dtype.scalar, dst_type.scalar):
            out = bf16_cast(src, dst_type)
            if out is not None:
                return out
        return orig_cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        s, d = src.dtype.scalar, dst_type.scalar
        if tl.bfloat16 in (s, d) and s.primitive_bitwidth >= 16 and d.primitive_bitwidth >= 16:
            out = bf16_cast(src, dst_type)
            if out is not None:
                return out
        return orig_fp_to_fp(self, src, dst_type, rounding_mode)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if tl.bfloat16 in (a.dtype.scalar, b.dtype.scalar):
            acc = d.data if d.dtype.scalar != tl.bfloat16 else _bf16_bits_to_f32(d.data)
            out = np.matmul(as_float(a).astype(np.float32), as_float(b).astype(np.float32), dtype=np.float32)
            out = out + acc.astype(np.float32)
            if d.dtype.scalar == tl.bfloat16:
                return TensorHandle(_to_bf16_bits(out), d.dtype.scalar)
            return TensorHandle(out.astype(d.data.dtype), d.dtype.scalar)
        return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def via_cast(self, src, dst_type):
        return self.cast_impl(src, dst_type)

    builder_cls.cast_impl = cast_impl
    for name in ("create_fp_ext", "create_fp_trunc", "create_si_to_fp", "create_ui_to_fp", "create_fp_to_si",
                 "create_fp_to_ui"):
        setattr(builder_cls, name, via_cast)
    builder_cls.create_fp_to_fp = create_fp_to_fp
    builder_cls.create_dot = create_dot
    _PATCHED = True
    return True


# --- no host reads ----------------------------------------------------------------------------------

_HOST_READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy"}
_DATA_DEPENDENT = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique_dim",
                   "aten::_unique2", "aten::unique_consecutive", "aten::item", "aten::is_nonzero"}


class _HostReadGuard(TorchFunctionMode):
    """Fails on a tensor method that hands a value to Python (tolist, item, bool(), int(), .cpu())."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in _HOST_READS:
            raise AssertionError(f"host read: Tensor.{func.__name__}")
        return func(*args, **(kwargs or {}))


class _SyncGuard(TorchDispatchMode):
    """Fails on an aten op that reads a value on the host or sizes its output by the data (a boolean
    index is a nonzero), and on a copy to another device."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in _DATA_DEPENDENT:
            raise AssertionError(f"host read: {name}")
        if name == "aten::index" and any(i is not None and i.dtype == torch.bool for i in args[1]):
            raise AssertionError("host read: a boolean index")
        out = func(*args, **(kwargs or {}))
        devices = {a.device for a in args if isinstance(a, torch.Tensor)}
        if isinstance(out, torch.Tensor) and devices and out.device not in devices:
            raise AssertionError(f"host read: {name} to {out.device}")
        return out


@contextlib.contextmanager
def no_host_reads():
    """Inside, any host read of a tensor's values (or a data-sized op, or a copy across devices) raises
    an ``AssertionError`` naming it: for code that must run without a synchronisation."""
    with _HostReadGuard(), _SyncGuard():
        yield


def prefilled_slots(pool, model, lengths, gen: torch.Generator) -> list[int]:
    """Slots of ``pool`` holding the prefills of random prompts of ``lengths`` (0: an empty prefix), one
    slot left free first so that the requests' slots are not 0..n-1 in order; returned in reverse."""
    spare = pool.allocate()
    slots = [pool.allocate() for _ in lengths]
    for slot, length in zip(slots, lengths):
        if length:
            cache = model.prefill(torch.randint(0, model.config.vocab_size, (length,), generator=gen))
            pool.load(slot, cache.keys, cache.values)
    pool.free(spare)
    return slots[::-1]
