"""Backend settings: ``torch.compile(model, backend="specfold", options={...})``.

Two dataclasses, every field documented where it is declared (``docs/options.md`` is generated from
them: ``python -m specfold_compile.backend.options_doc > docs/options.md``):

* ``SpecFoldSettings``: the user options, grouped as meaning (what is computed: the contract of
  docs/SPEC.md), implementation (how), debugging, and kill switches (turn one rewrite off to bisect;
  results stay the same).
* ``Tuning`` (``options["tuning"]``, or ``SpecFoldBackend(tuning=Tuning(...))``): every performance knob.
  A knob is tuning when it only moves time: any value keeps every call's output within docs/SPEC.md's
  contract for the chosen tau (which calls fold is tuning too: a call run on the plain graph is the dense
  forward, the exact end of that contract). Defaults come from a ``DeviceProfile`` (the H200's).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from ..kernels.attention_tuning import AttentionTuning
from ..ops.device_profile import H200, DeviceProfile
from ._checks import GATE_FLAGS, GATES, KERNELS, check_value

__all__ = ["SpecFoldSettings", "Tuning", "FLAT_TUNING", "GATES", "GATE_FLAGS", "KERNELS", "MIN_BLOCK_R_ENV"]

MIN_BLOCK_R_ENV = "SPECFOLD_PACKED_LINEAR_MIN_BLOCK_R"
# Tuning knobs that are also accepted as flat options (options={"dense_fraction": 0.3}).
FLAT_TUNING = ("dense_fraction", "min_spill_us", "fold_min_branches", "fold_launched", "combo_kernels")


def _opt(default: Any = dataclasses.MISSING, group: str = "", doc: str = "", kind: str = "", factory=None,
         shown: str | None = None):
    """A documented field: ``group`` and ``doc`` go to docs/options.md, ``kind`` to the value check
    (``_checks.check_value``), ``shown`` replaces the default in the docs (a default read at run time)."""
    meta = {"group": group, "doc": " ".join(doc.split()), "kind": kind, "shown": shown}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _min_block_r_default() -> int:
    value = os.environ.get(MIN_BLOCK_R_ENV)
    if value is None:
        return H200.packed_linear_min_block_r
    try:
        return check_value(f"environment variable {MIN_BLOCK_R_ENV}", int(value), "min_block_r")
    except (TypeError, ValueError):
        raise ValueError(f"environment variable {MIN_BLOCK_R_ENV}: expected an integer from 1 to 128, "
                         f"got {value!r}") from None


@dataclass(frozen=True)
class Tuning:
    """Every performance knob of the backend, with the H200 profile's defaults (``Tuning.from_profile``
    for another device). None of them changes what a call computes beyond docs/SPEC.md's contract."""

    fold_min_branches: int | None = _opt(None, "which calls fold", kind="fold_min_branches", doc="""
        Which calls to fold, by their branch count N. None: the cost model (``backend/dispatch.py``)
        when the Triton kernels run on CUDA: fold a call when the rows its linears skip are estimated to
        save more than folding's fixed cost per layer (``fold_overhead_us``), else run the plain graph,
        compiled alongside (with few branches the linears are bandwidth-bound and folding only adds
        launches); elsewhere (CPU, kernels="torch") fold every multi-branch call. An int k: fold calls
        with N >= k, run the plain graph below (2 = fold every call). The cost model decides for captured
        calls (see fold_launched).""")
    fold_launched: bool = _opt(False, "which calls fold", kind="bool", doc="""
        With the cost model (fold_min_branches None, Triton kernels on CUDA): whether a call it folds also
        folds when launched from the host rather than captured in a CUDA graph. False: launched calls run
        the plain graph (the first at each N also runs the folded one once, its result dropped, to warm
        it, autotuning included, for a later capture). A folded forward's host work is what a launched
        call costs: on the H200's host 34-58 ms against 10-29 ms for the plain graph, at 1.5B and 7B,
        1.8-3.3x slower launched; replayed from a CUDA graph it is 0.5-0.9x the plain graph at recompute
        ratios <= 0.25. True: fold launched calls too. Inside ``backend.fold_launched_calls()`` launched
        calls fold either way. A loop that never captures pays the folded graph's compile and one folded
        run per N for nothing: ``fold=False`` skips both.""")
    fold_overhead_us: float = _opt(H200.fold_overhead_us, "which calls fold", kind="us", doc="""
        The cost model's fixed cost of folding, microseconds per gated region (decoder layer): the gate,
        origin resolution, packing gathers, spill launches and the folded attention's launches.""")
    max_planned_branches: int = _opt(128, "which calls fold", kind="int>=2", doc="""
        Dynamic-N graphs: which variants (folded, plain or both) to compile is decided over N = 2 .. this;
        beyond it a call runs whichever variant exists when its own decision's variant was not compiled.""")
    dense_fraction: float | tuple[float, ...] = _opt(H200.dense_fraction, "packed linears", kind="fractions", doc="""
        Packed linears (Triton kernels) hand their first max(dense_linear_min_rows, dense_fraction * R)
        packed rows (a multiple of dense_linear_row_multiple, at most R) to cuBLAS unconditionally;
        computed rows beyond that spill to the count-aware Triton GEMM, whose tiles past the device-side
        count exit at once. Set it a little above the recompute ratios you expect: 1.0 = cuBLAS on every
        row (no saving in the linears), 0.0 = all rows through the Triton GEMM. No effect with
        kernels="torch". At 0.45 the head holds 159 of the 161 folded calls of the task suite at tau = 0.1
        (0.3: 141); against 0.3 it costs 0-12% at low ratios and saves 33-40% at ratios 0.34-0.44 (H200).
        0.2 (128 rows up to N = 20) is 6-14% faster up to N = 17 where the computed rows fit and 16-83%
        slower where they do not. A sequence gives each decoder layer its own head, spread over the
        depth (layer l of L takes entry l * len // L; the LM head's region the last): deeper layers
        compute more rows, so a profile measured on the workload (``ops.fold_masks.dense_fractions``
        over recorded fold masks) lets the shallow layers skip more.""")
    min_spill_us: float = _opt(H200.min_spill_us, "packed linears", kind="us", doc="""
        With Triton kernels, a packed linear skips its spill launch and gives cuBLAS every row when that
        is estimated (from the weight's shape and the roofline, gemm_bytes_per_s / gemm_flops_per_s) to
        cost less than this many microseconds more than the head alone: a spill launch costs ~2 us even
        with nothing to do, more than the extra rows of a small weight (k/v projections, tiny models).
        0 = always split. 2: 2-3% faster than 0 at the 1.5B shape (N = 5-33), within +-1% at 7B (H200).""")
    dense_linear_min_rows: int = _opt(H200.dense_linear_min_rows, "packed linears", kind="int>=0", doc="""
        The cuBLAS head of a packed linear never has fewer rows: below the device's ridge (~184 rows on
        the H200) a GEMM reads its weights for longer than it computes, so fewer rows save nothing.""")
    dense_linear_row_multiple: int = _opt(H200.dense_linear_row_multiple, "packed linears", kind="int>=1",
                                          doc="""The cuBLAS head's row count is a multiple of this (whole
        row tiles of the spill kernel).""")
    packed_linear_min_block_r: int = _opt(group="packed linears", kind="min_block_r",
                                          factory=_min_block_r_default,
                                          shown=f"{H200.packed_linear_min_block_r} (or ${MIN_BLOCK_R_ENV})",
                                          doc="""The spill GEMM's autotuner keeps row tiles of at least this
        many rows (every row tile reads the whole weight: 16-row tiles chosen on a light load took 2.3-2.8x
        longer once many rows spilled, on the H200). 16 restores every candidate, for A/B runs. The
        default is read from the environment variable when set (an integer 1-128).""")
    gemm_bytes_per_s: float = _opt(H200.gemm_bytes_per_s, "packed linears", kind="rate", doc="""
        The device's copy bandwidth in the GEMM roofline of min_spill_us and the cost model.""")
    gemm_flops_per_s: float = _opt(H200.gemm_flops_per_s, "packed linears", kind="rate", doc="""
        The device's dense bf16 rate in the same roofline.""")
    one_pass_max_prefix: int = _opt(H200.one_pass_max_prefix, "attention", kind="int>=-1", doc="""
        Folded attention runs in one pass (the block kernel walks the prefix itself, for every row) for at
        most this many prefix keys (and one_pass_max_work); otherwise prefix states of the computed rows
        plus a merging block kernel (two launches). -1: never one pass (a bisection switch).""")
    one_pass_max_work: int = _opt(H200.one_pass_max_work, "attention", kind="int>=0", doc="""
        ... and at most this many rows x query heads x prefix keys (one pass repeats a folded row's walk).""")
    split_tile_us: float = _opt(H200.split_tile_us, "attention", kind="us", doc="""
        Split cost model of the prefix kernel: microseconds to walk one 64-key tile in a program.""")
    split_merge_us: float = _opt(H200.split_merge_us, "attention", kind="us", doc="""
        ... what one more split state costs the block kernel's merge (and the prefix kernel's extra
        programs), at least.""")
    split_merge_us_per_row_head: float = _opt(H200.split_merge_us_per_row_head, "attention", kind="us", doc="""
        ... or this much per merged row x query head, when that is more.""")
    programs_per_sm: int = _opt(H200.programs_per_sm, "attention", kind="int>=1", doc="""
        At most this many working prefix programs share an SM when the split count is chosen.""")
    folded_rows_guess: float = _opt(H200.folded_rows_guess, "attention", kind="fraction>0", doc="""
        Share of its rows a folded call is assumed to compute when the prefix kernel's working programs
        are counted (the task suite recomputes 16-25% of the draft rows at tau = 0.1).""")
    min_split_prefix: int = _opt(H200.min_split_prefix, "attention", kind="int>=0", doc="""
        Prefixes shorter than this never split (at 512 keys splitting lost at every N measured).""")
    combo_kernels: bool = _opt(False, "inductor", kind="bool", doc="""
        With Inductor lowering: let Inductor combine kernels that do not depend on each other into one
        launch (``torch._inductor.config.combo_kernels``, experimental in torch). A folded layer's Inductor
        kernels are latency-bound launches of a few us (e.g. the RoPE of q and of k). Measured (H200,
        1.5B, N = 17, r = 0.19): 3.33 against 3.37 ms, 1.2% faster, first compile 23 s against 44 s; off
        by default while torch calls the feature experimental.""")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, check_value(f"tuning.{f.name}", getattr(self, f.name),
                                                         f.metadata["kind"]))

    @classmethod
    def from_profile(cls, profile: DeviceProfile, **changes: Any) -> "Tuning":
        """The defaults of another device's profile (the fields both have), then ``changes``."""
        names = {f.name for f in dataclasses.fields(profile)}
        base = {f.name: getattr(profile, f.name) for f in dataclasses.fields(cls) if f.name in names}
        return cls(**{**base, **changes})

    @property
    def attention(self) -> AttentionTuning:
        return AttentionTuning.from_fields(self)

    def folded_attention_args(self) -> dict[str, Any]:
        """Keyword arguments of ``specfold::folded_attention`` carrying these values."""
        return self.attention.as_dict()

    def packed_linear_args(self) -> dict[str, Any]:
        """Keyword arguments of ``specfold::packed_linear`` carrying these values (besides its
        ``dense_fraction`` and ``min_spill_us``)."""
        return {name: getattr(self, name) for name in ("packed_linear_min_block_r", "dense_linear_min_rows",
                                                       "dense_linear_row_multiple", "gemm_bytes_per_s",
                                                       "gemm_flops_per_s")}


def _as_tuning(label: str, value: Any) -> Tuning:
    if isinstance(value, Tuning):
        return value
    if isinstance(value, dict):
        return Tuning(**value)
    raise TypeError(f"{label}: expected a Tuning (or a dict of its fields), got {value!r}")


@dataclass(frozen=True, init=False)
class SpecFoldSettings:
    """Every option, with its default (keyword arguments; the flat tuning names of ``FLAT_TUNING`` are
    accepted too and go into ``tuning``)."""

    tau: float = _opt(0.1, "meaning", kind="tau", doc="""
        Fold threshold of the residual gate (docs/SPEC.md section 2); 0 folds nothing; compared in
        float32 (past float32's range: inf, see ``gate_tau``). At tau = 0 the output equals dense
        verification within rounding (docs/SPEC.md P1), not bitwise (packed GEMMs, the attention
        correction's merge, one-rounding SwiGLU, Inductor): in float32 (~1e-6 relative) SpecFold then
        decodes Spiffy's tokens unless a decision is tied that closely (tested on the trained model); in
        bf16/fp16 the logits agree within the dtype's rounding, which can flip near-tied argmaxes, so
        tokens are not claimed equal there.""")
    gate: str = _opt("layer", "meaning", kind="gate", doc="""
        "layer" (one gate per decoder layer) or "sublayer" (re-gate the MLP at h_mid).""")
    fold_head: bool = _opt(False, "meaning", kind="bool", doc="""
        Also gate the final norm and LM head (docs/SPEC.md section 2 option): folded rows take their
        origin's logits.""")
    kernels: str = _opt("auto", "implementation", kind="kernels", doc="""
        "auto" (Triton on CUDA when available, else torch), "torch" (reference custom ops) or "triton"
        (generated kernels; on CPU only under TRITON_INTERPRET=1).""")
    inductor: bool | None = _opt(None, "implementation", kind="bool_or_none", doc="""
        Lower the rewritten graph through Inductor (fuses the norms, RoPE and other elementwise work
        around the fold ops, which stay extern kernels). None: on when the graph's inputs are on CUDA and
        Triton imports (0.6-0.7x the un-lowered latency on the H200, for 20-45 s more compile time), off
        on CPU (where it needs a C++ compiler and gains little).""")
    gate_flags: str = _opt("kernel", "implementation", kind="gate_flags", doc="""
        Where the gate's fold flags are computed: "kernel" (inside the gate op: with Triton kernels, a pass
        over the residual rows and then the resolve, two launches) or "graph" (as plain tensor ops before
        the gate op, which Inductor can fuse into the reduction of the layer's input norm; the gate op
        then only resolves and compacts, one launch). Same decisions either way. Measured: no gain (H200,
        1.5B N = 17: 4.26 vs 4.24 ms), so "kernel" stays the default.""")
    strict: bool = _opt(False, "debugging", kind="bool", doc="""
        Raise ``SpecFoldError`` instead of falling back to the unchanged graph.""")
    dump_dir: str | None = _opt(None, "debugging", kind="path_or_none", shown="None (or $SPECFOLD_DUMP_DIR)",
                                doc="""Write the graph before/after every pass and a region report here
        (``from_options``, as torch.compile's options use: the SPECFOLD_DUMP_DIR environment variable when
        not given, else no dumps).""")
    fold: bool = _opt(True, "kill switches", kind="bool", doc="""
        Gate and fold at all (off = the dense graph, marker removed).""")
    pack: bool = _opt(True, "kill switches", kind="bool", doc="""
        Run position-wise layers on the computed rows only (off = compute every row, then read origins;
        same results).""")
    attention_correction: bool = _opt(True, "kill switches", kind="bool", doc="""
        Reuse the origin's prefix attention state and merge the branch's own block (off = full attention
        per row with the inherited q/k/v; same results).""")
    count_aware_swiglu: bool = _opt(True, "kill switches", kind="bool", doc="""
        The packed MLP's activation silu(gate) * up becomes ``specfold::packed_silu_mul``, whose Triton
        kernel skips the rows past the device-side count (Inductor's elementwise kernel walks all N * B
        rows of the widest tensors of the layer). Same values (tested). A switch of one rewrite, like
        pack, rather than a tuning knob: off bisects the rewrite away.""")
    tuning: Tuning = _opt(group="tuning", kind="tuning", factory=Tuning, shown="Tuning()", doc="""
        The performance knobs (``Tuning``, or a dict of its fields), below.""")

    def __init__(self, **options: Any) -> None:
        names = [f.name for f in dataclasses.fields(SpecFoldSettings)]
        unknown = sorted(set(options) - set(names) - set(FLAT_TUNING))
        if unknown:
            raise TypeError(f"SpecFoldSettings: unknown option(s) {unknown}; valid options: {names + list(FLAT_TUNING)}")
        flat = {name: options.pop(name) for name in FLAT_TUNING if name in options}
        for f in dataclasses.fields(SpecFoldSettings):
            value = options[f.name] if f.name in options else (
                f.default_factory() if f.default is dataclasses.MISSING else f.default)
            label, kind = f"options[{f.name!r}]", f.metadata["kind"]
            checked = _as_tuning(label, value) if kind == "tuning" else check_value(label, value, kind)
            object.__setattr__(self, f.name, checked)
        if flat:
            kinds = {f.name: f.metadata["kind"] for f in dataclasses.fields(Tuning)}
            checked = {k: check_value(f"options[{k!r}]", v, kinds[k]) for k, v in flat.items()}
            object.__setattr__(self, "tuning", dataclasses.replace(self.tuning, **checked))

    # The flat tuning names, read through the settings as well (the same values as ``tuning``'s).
    dense_fraction = property(lambda self: self.tuning.dense_fraction)
    min_spill_us = property(lambda self: self.tuning.min_spill_us)
    fold_min_branches = property(lambda self: self.tuning.fold_min_branches)
    fold_launched = property(lambda self: self.tuning.fold_launched)
    combo_kernels = property(lambda self: self.tuning.combo_kernels)

    @property
    def gate_tau(self) -> float:
        """tau as the float32 the gate compares in (docs/SPEC.md section 2): rounded, so a tau past
        float32's range (3.4e38) is inf, which folds every row whose difference to its parent is finite
        and whose parent row is finite and nonzero."""
        return float(torch.tensor(self.tau, dtype=torch.float64).to(torch.float32))

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> "SpecFoldSettings":
        options = dict(options or {})
        valid = [f.name for f in dataclasses.fields(cls)] + list(FLAT_TUNING)
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(f"options: unknown option(s) {unknown}; valid options: {valid}")
        options.setdefault("dump_dir", os.environ.get("SPECFOLD_DUMP_DIR") or None)
        return cls(**options)
