"""Backend settings: ``torch.compile(model, backend="specfold", options={...})``."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

GATES = ("layer", "sublayer")
GATE_FLAGS = ("kernel", "graph")
KERNELS = ("auto", "torch", "triton")


@dataclass(frozen=True)
class SpecFoldSettings:
    """Every option, with its default.

    tau:                  fold threshold of the residual gate (SPEC section 2); 0 folds nothing; compared
                          in float32 (past float32's range: inf, see ``gate_tau``). At tau = 0 the output
                          equals dense verification within rounding (SPEC P1), not bitwise (packed GEMMs,
                          the attention correction's merge, one-rounding SwiGLU, Inductor): in float32
                          (~1e-6 relative) SpecFold then decodes Spiffy's tokens unless a decision is
                          tied that closely (tested on the trained model); in bf16/fp16 the logits agree
                          within the dtype's rounding, which can flip near-tied argmaxes, so tokens are
                          not claimed equal there.
    gate:                 "layer" (one gate per decoder layer) or "sublayer" (re-gate the MLP at h_mid).
    kernels:              "auto" (Triton on CUDA when available, else torch), "torch" (reference custom
                          ops) or "triton" (generated kernels; on CPU only under TRITON_INTERPRET=1).
    strict:               raise ``SpecFoldError`` instead of falling back to the unchanged graph.
    dump_dir:             write the graph before/after every pass and a region report here
                          (default: the SPECFOLD_DUMP_DIR environment variable, else no dumps).
    fold:                 switch: gate and fold at all (off = the dense graph, marker removed).
    pack:                 switch: run position-wise layers on the computed rows only (off = compute
                          every row, then read origins; same results).
    attention_correction: switch: reuse the origin's prefix attention state and merge the branch's own
                          block (off = full attention per row with the inherited q/k/v; same results).
    gate_flags:           where the gate's fold flags are computed: "kernel" (inside the gate op: with
                          Triton kernels, a pass over the residual rows and then the resolve, two
                          launches) or "graph" (as plain tensor ops before the gate op, which Inductor
                          can fuse into the reduction of the layer's input norm; the gate op then only
                          resolves and compacts, one launch). Same decisions either way. Measured:
                          no gain (H200, 1.5B N = 17: 4.26 vs 4.24 ms), so "kernel" stays the default.
    fold_head:            also gate the final norm and LM head (SPEC section 2 option): folded rows take
                          their origin's logits. Off by default.
    inductor:             lower the rewritten graph through Inductor (fuses the norms, RoPE and other
                          elementwise work around the fold ops, which stay extern kernels). None (the
                          default): on when the graph's inputs are on CUDA and Triton imports (0.6-0.7x
                          the un-lowered latency on the H200, for 20-45 s more compile time), off on
                          CPU (where it needs a C++ compiler and gains little).
    combo_kernels:        with Inductor lowering: let Inductor combine kernels that do not depend on each
                          other into one launch (``torch._inductor.config.combo_kernels``, experimental
                          in torch). A folded layer's Inductor kernels are latency-bound launches of a few
                          us (e.g. the RoPE of q and of k, two kernels a layer). Measured (H200, 1.5B,
                          N = 17, r = 0.19, session 17): 3.33 against 3.37 ms, 1.2% faster, first compile
                          23 s against 44 s; off by default while torch calls the feature experimental.
    dense_fraction:       packed linears (Triton kernels) hand their first max(128, dense_fraction * R)
                          packed rows (a multiple of 64, at most R) to cuBLAS unconditionally; computed
                          rows beyond that spill to the count-aware Triton GEMM, whose tiles past the
                          device-side count exit at once. Set it a little above the recompute ratios you
                          expect: 1.0 = cuBLAS on every row (no saving in the linears), 0.0 = all rows
                          through the Triton GEMM. No effect with kernels="torch". At 0.45 the head
                          holds 159 of the 161 folded calls of the task suite at tau = 0.1 (0.3: 141);
                          against 0.3 it costs 0-12% at low ratios and saves 33-40% at ratios 0.34-0.44
                          (H200, docs/results.md "dense_fraction"). 0.2 (128 rows up to N = 20) is 6-14% faster
                          up to N = 17 where the computed rows fit and 16-83% slower where they do not
                          (session 11, docs/results.md "A 128-row head").
    min_spill_us:         with Triton kernels, a packed linear skips its spill launch and gives cuBLAS
                          every row when that is estimated (from the weight's shape at the H200's
                          bandwidth and bf16 rate) to cost less than this many microseconds more than
                          the head alone: a spill launch costs ~2 us even with nothing to do, more than
                          the extra rows of a small weight (k/v projections, tiny models). 0 = always
                          split. Default 2: 2-3% faster than 0 at the 1.5B shape (N = 5-33), within
                          +-1% at 7B (H200, docs/results.md "min_spill_us").
    count_aware_swiglu:   switch: the packed MLP's activation silu(gate) * up becomes
                          ``specfold::packed_silu_mul``, whose Triton kernel skips the rows past the
                          device-side count (Inductor's elementwise kernel walks all N * B rows of the
                          widest tensors of the layer). Same values (tested).
    fold_min_branches:    which calls to fold, by their branch count N. None (default): the cost model
                          (``backend/dispatch.py``) when the Triton kernels run on CUDA: fold a call
                          when the rows its linears skip are estimated to save more than folding's
                          fixed cost per layer, else run the plain graph, compiled alongside (with few
                          branches the linears are bandwidth-bound and folding only adds launches);
                          elsewhere (CPU, kernels="torch") fold every multi-branch call. An int k:
                          fold calls with N >= k, run the plain graph below (2 = fold every call).
                          The cost model's decision is for captured calls (see fold_launched).
    fold_launched:        with the cost model (fold_min_branches None, Triton kernels on CUDA): whether
                          a call it folds also folds when launched from the host rather than captured
                          in a CUDA graph. False (default): launched calls run the plain graph (the
                          first at each N also runs the folded one once, its result dropped, to warm it,
                          autotuning included, for a later capture). A folded forward's host work is
                          what a launched call costs:
                          on the H200's host 34-58 ms against 10-29 ms for the plain graph, at 1.5B and
                          7B, 1.8-3.3x slower launched (session 13, docs/results.md "Launched calls"); replayed
                          from a CUDA graph it is 0.5-0.9x the plain graph at recompute ratios <= 0.25.
                          True: fold launched calls too. Inside ``backend.fold_launched_calls()``
                          launched calls fold either way. A loop that never captures pays the folded
                          graph's compile and one folded run per N for nothing: ``fold=False`` skips both.
    """

    tau: float = 0.1
    gate: str = "layer"
    kernels: str = "auto"
    strict: bool = False
    dump_dir: str | None = None
    fold: bool = True
    pack: bool = True
    attention_correction: bool = True
    gate_flags: str = "kernel"
    fold_head: bool = False
    inductor: bool | None = None
    combo_kernels: bool = False
    dense_fraction: float = 0.45
    min_spill_us: float = 2.0
    count_aware_swiglu: bool = True
    fold_min_branches: int | None = None
    fold_launched: bool = False

    def __post_init__(self) -> None:
        try:
            tau = float(self.tau)
        except OverflowError:  # an int past float's range
            tau = math.inf
        except (TypeError, ValueError):
            tau = math.nan  # e.g. "abc" or None: reported below, naming the option
        if isinstance(self.tau, bool) or math.isnan(tau) or tau < 0:
            raise ValueError(f"options['tau']: expected a number >= 0, got {self.tau!r}")
        object.__setattr__(self, "tau", tau)
        if self.dump_dir is not None and not isinstance(self.dump_dir, (str, os.PathLike)):
            raise TypeError(f"options['dump_dir']: expected None or a path, got {self.dump_dir!r}")
        if self.gate not in GATES:
            raise ValueError(f"options['gate']: expected one of {GATES}, got {self.gate!r}")
        if self.gate_flags not in GATE_FLAGS:
            raise ValueError(f"options['gate_flags']: expected one of {GATE_FLAGS}, got {self.gate_flags!r}")
        if self.kernels not in KERNELS:
            raise ValueError(f"options['kernels']: expected one of {KERNELS}, got {self.kernels!r}")
        for name in ("strict", "fold", "pack", "attention_correction", "fold_head", "count_aware_swiglu",
                     "fold_launched", "combo_kernels"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"options[{name!r}]: expected a bool, got {getattr(self, name)!r}")
        if self.inductor is not None and not isinstance(self.inductor, bool):
            raise TypeError(f"options['inductor']: expected a bool or None (auto), got {self.inductor!r}")
        frac = self.dense_fraction
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 <= frac <= 1.0:
            raise ValueError(f"options['dense_fraction']: expected a number in [0, 1], got {frac!r}")
        object.__setattr__(self, "dense_fraction", float(frac))
        us = self.min_spill_us
        if isinstance(us, bool) or not isinstance(us, (int, float)) or not 0.0 <= us < math.inf:
            raise ValueError(f"options['min_spill_us']: expected a finite number >= 0, got {us!r}")
        object.__setattr__(self, "min_spill_us", float(us))
        k = self.fold_min_branches
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"options['fold_min_branches']: expected None (cost model) or an int >= 1, got {k!r}")

    @property
    def gate_tau(self) -> float:
        """tau as the float32 the gate compares in (SPEC section 2): rounded, so a tau past float32's range
        (3.4e38) is inf, which folds every row whose difference to its parent is finite and whose parent
        row is finite and nonzero."""
        return float(torch.tensor(self.tau, dtype=torch.float64).to(torch.float32))

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> "SpecFoldSettings":
        options = dict(options or {})
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(f"options: unknown option(s) {unknown}; valid options: {valid}")
        options.setdefault("dump_dir", os.environ.get("SPECFOLD_DUMP_DIR") or None)
        return cls(**options)
