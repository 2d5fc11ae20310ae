"""The host-side choices of the attention launchers, passed in by the caller (``AttentionTuning``).

The numbers themselves are per device: ``specfold_compile.ops.device_profile`` holds them (with what
they were fitted to), and the backend's ``Tuning`` lets a user change them. Importable without triton.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionTuning:
    """One pass or two kernels, and the prefix kernel's split count: decided from shapes only, so a
    captured CUDA graph replays the same launches.

    one_pass_max_prefix:         one pass (the block kernel walks the prefix itself, for every row) for at
                                 most this many prefix keys; -1 never (a bisection switch).
    one_pass_max_work:           ... and at most this many rows x query heads x prefix keys.
    split_tile_us:               estimated cost of walking one 64-key tile in a prefix program.
    split_merge_us:              estimated cost of merging one more split state in the block kernel ...
    split_merge_us_per_row_head: ... or this much a merged row x query head, when that is more.
    programs_per_sm:             working prefix programs that may share an SM.
    folded_rows_guess:           share of the rows a folded call (one with a device-side count) is assumed
                                 to compute when its working programs are counted.
    min_split_prefix:            prefixes shorter than this never split.
    """

    one_pass_max_prefix: int
    one_pass_max_work: int
    split_tile_us: float
    split_merge_us: float
    split_merge_us_per_row_head: float
    programs_per_sm: int
    folded_rows_guess: float
    min_split_prefix: int

    @classmethod
    def from_fields(cls, source) -> "AttentionTuning":
        """The fields of the same names of ``source`` (a DeviceProfile, a Tuning, a dict of op arguments)."""
        get = source.get if isinstance(source, dict) else (lambda name: getattr(source, name))
        return cls(**{f.name: get(f.name) for f in dataclasses.fields(cls)})

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
