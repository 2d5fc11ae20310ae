"""The cost model's numbers for one device (``DeviceProfile``), measured on it; ``H200`` is the default.

Everything here is a number about the hardware or a default fitted on it: the GEMM roofline, what
folding costs a layer, the attention launchers' one-pass and split thresholds, the packed linear's
row tiles, and the measured best defaults of the backend's tuning knobs. ``backend.settings.Tuning``
takes its defaults from a profile; the fold ops and kernels receive the values as arguments.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from ..kernels.attention_tuning import AttentionTuning


@dataclass(frozen=True)
class DeviceProfile:
    """Per-device numbers (see ``H200`` for what each was fitted to)."""

    name: str
    gemm_bytes_per_s: float  # copy bandwidth of one GEMM reading its weights
    gemm_flops_per_s: float  # dense bf16 rate
    dense_linear_min_rows: int  # the cuBLAS head of a packed linear never has fewer rows
    dense_linear_row_multiple: int  # ... and is a multiple of this (whole row tiles of the spill kernel)
    fold_overhead_us: float  # what folding adds per gated region when it runs, whatever it saves
    one_pass_max_prefix: int
    one_pass_max_work: int
    split_tile_us: float
    split_merge_us: float
    split_merge_us_per_row_head: float
    programs_per_sm: int
    folded_rows_guess: float
    min_split_prefix: int
    packed_linear_min_block_r: int  # the packed linear's autotuner keeps row tiles of at least this
    dense_fraction: float  # measured best default of Tuning.dense_fraction
    min_spill_us: float  # measured best default of Tuning.min_spill_us

    @functools.cached_property
    def attention(self) -> AttentionTuning:
        """The attention launchers' share of the profile (made once a profile: launchers ask every call)."""
        return AttentionTuning.from_fields(self)

    def replace(self, **changes) -> "DeviceProfile":
        return dataclasses.replace(self, **changes)


H200 = DeviceProfile(
    name="h200",
    # Copy bandwidth and bf16 rate measured on the H200 (bench/common.py's roofline floors use them).
    gemm_bytes_per_s=4.3e12,
    gemm_flops_per_s=790e12,
    # A bf16 GEMM with fewer rows than ~184 (the H200's ridge, FLOP/byte) reads its weights for longer
    # than it computes, so computing fewer rows saves nothing: the cuBLAS head never goes below 128.
    dense_linear_min_rows=128,
    dense_linear_row_multiple=64,
    # The per-check table with every call folded put dense Inductor minus SpecFold at the estimated
    # saving minus 3-18 us a layer wherever the estimate is small; 18 is where the decision matters (N = 9).
    fold_overhead_us=18.0,
    # One pass against prefix states + block merge (``bench/kernels/bench_attention.py --one-pass-sweep``),
    # both kernels -> one pass, us: prefix 512, N = 1: 17.7 -> 10.3 (1.5B), 18.0 -> 10.4 (7B); N = 5:
    # 18.1 -> 10.7 and 18.8 -> 17.2 (7B: 160 rows x 28 heads x 512 keys, the work bound); prefix 1024,
    # N = 1: 19.9 -> 17.4 and 20.1 -> 17.4, N = 5: 20.2 -> 17.7 at 1.5B but 25.4 -> 29.3 at 7B; at N = 17
    # one pass lost or tied at both shapes.
    one_pass_max_prefix=1024,
    one_pass_max_work=160 * 28 * 512,
    # The split count's cost model (``bench/kernels/bench_attention.py``): walking the prefix costs ~1.0 us
    # a 64-key tile in a program (36 us for 2048 keys at N = 1); every split beyond the first costs the
    # block kernel's merge ~1.6 us, more once the rows x query heads merged pass ~3500 (3.3-4.5 us a split
    # at 7B, N = 17; 5-7 us at N = 33). 2.5 rather than 1.6 also charges what the extra programs cost the
    # prefix kernel (fitted with programs_per_sm and folded_rows_guess to ``--split-sweep``: 60 points of
    # 1.5B / 7B, prefix 1024-4096, N = 1-33, all rows or 19% computed; the rule's pick is 1.02x the best
    # split count on average, 1.10x at worst). A folded call recomputes 16-25% of its draft rows in the
    # task suite at tau = 0.1, plus every row of the main block (N = 17, r = 0.19: 129 of 544 rows). At
    # 512 keys splitting lost at every N measured (N = 1: 18 -> 22 us for both kernels).
    split_tile_us=1.0,
    split_merge_us=2.5,
    split_merge_us_per_row_head=0.45e-3,
    programs_per_sm=2,
    folded_rows_guess=0.25,
    min_split_prefix=1024,
    # Every row tile of the spill GEMM reads the whole weight: the 16-row tiles the autotuner picked when
    # timing ~72 spilled rows took 2.3-2.8x longer at 7B once 288 rows spilled (down: 307 against 131 us),
    # while the best 64-row tiles were at most 3.5 us slower at any spill size
    # (``bench/kernels/bench_count_gemm.py --spill-configs``, 1.5B and 7B shapes).
    packed_linear_min_block_r=64,
    # See Tuning.dense_fraction and Tuning.min_spill_us (docs/options.md) for the measurements.
    dense_fraction=0.45,
    min_spill_us=2.0,
)

PROFILES = {H200.name: H200}
