"""The folded attention's launch plan, from shapes only (so a captured CUDA graph replays the same
launches for any prefix length): tile configs of the prefix and one-pass kernels, whether a call runs
in one pass, and how many splits the prefix walk takes. No Triton needed to plan."""
from __future__ import annotations

import functools

import torch

from ._common import interpreting
from .attention_tuning import AttentionTuning


def _prefix_config(M_total: int, D: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_P, num_warps, num_stages) of the prefix kernel for M_total = rows * group."""
    if interpreting():
        return 16, 16, 4, 2
    if M_total <= 64 * 132:
        # three stages beat two at every point of the H200 sweep (1.5B and 7B shapes, prefix 512 / 2048,
        # N = 5 / 17, all rows or 19% computed: 8-18% faster; ``bench/kernels/bench_attention.py --sweep``)
        return 64, 64, 4, 3
    return 128, 64, 8, 2


# Attention runs in one pass (``one_pass_attention``: the block kernel walks the prefix itself, for every
# row, in programs of 16 query rows of one kv head) when the prefix and the walk (rows x query heads x
# prefix keys) are small enough (``AttentionTuning.one_pass_max_prefix`` / ``one_pass_max_work``);
# otherwise a prefix kernel writes states for the computed rows and the block kernel merges them (two
# launches and a state round trip; from ``min_split_prefix`` keys on it can split the prefix).


def _one_pass_config() -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_P, num_warps, num_stages) of the one-pass kernel: 16 query rows a program (the
    best of 24 configs at every N = 1 and N = 5 point of the sweep: more programs walk the prefix)."""
    if interpreting():
        return 16, 16, 4, 2
    return 16, 64, 4, 3


def use_one_pass(rows: int, q_heads: int, prefix: int, tuning: AttentionTuning) -> bool:
    """Whether ``slot_attention`` runs one pass for ``rows`` rows (N * B, each walking the prefix) of
    ``q_heads`` query heads over ``prefix`` keys (shapes only: a captured CUDA graph replays the same
    launches)."""
    return prefix <= tuning.one_pass_max_prefix and rows * q_heads * prefix <= tuning.one_pass_max_work


def _check_tile_config(config) -> tuple[int, int, int, int]:
    ok = isinstance(config, tuple) and len(config) == 4 and all(isinstance(c, int) and c >= 1 for c in config)
    if ok:
        block_m, block_p, warps, _ = config
        ok = all(b >= 16 and b & (b - 1) == 0 for b in (block_m, block_p)) and warps & (warps - 1) == 0
    if not ok:
        raise ValueError("config: expected (BLOCK_M, BLOCK_P, num_warps, num_stages), block sizes powers of "
                         f"two >= 16 and num_warps a power of two, got {config!r}")
    return config


SPLIT_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16)
MAX_PREFIX_SPLITS = SPLIT_CHOICES[-1]
# The split count's cost model (``AttentionTuning``; the numbers and what they were fitted to are in
# ``ops/device_profile.py``): a program walks its share of the prefix's key tiles at ``split_tile_us`` a
# tile, and every split beyond the first costs the block kernel's merge max(split_merge_us,
# split_merge_us_per_row_head * rows * Hq); at most ``programs_per_sm`` working programs share an SM.


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def prefix_splits(programs: int, P: int, block_p: int, device: torch.device, row_heads: int = 0, *,
                  tuning: AttentionTuning) -> int:
    """The split count with the least estimated time of both kernels: the key tiles each program walks
    plus the merge cost of the extra states (``row_heads``: rows x query heads the block kernel merges),
    among the counts of SPLIT_CHOICES that put at most ``tuning.programs_per_sm`` of the ``programs``
    (the ones expected to have rows) on an SM. One split off the GPU and below
    ``tuning.min_split_prefix`` keys. From shapes only, so a captured CUDA graph replays the same launch."""
    if device.type != "cuda" or interpreting() or P < tuning.min_split_prefix:
        return 1
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    tiles = -(-P // block_p)
    most = max(1, min(tiles, MAX_PREFIX_SPLITS, tuning.programs_per_sm * sms // max(programs, 1)))
    merge_us = max(tuning.split_merge_us, tuning.split_merge_us_per_row_head * row_heads)
    return min((s for s in SPLIT_CHOICES if s <= most),
               key=lambda s: tuning.split_tile_us * -(-tiles // s) + merge_us * (s - 1))
