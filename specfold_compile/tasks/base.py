"""Shared pieces of the synthetic tasks: the problem record and the split assignment.

Splits are assigned by hashing a problem's *skeleton* (the structured key that fully determines the
problem, e.g. template + numbers), so the same problem can never land in two splits, whatever seed
generated it: 80% train, 10% calib, 10% test of the skeleton space.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any, Callable

SPLITS = ("train", "calib", "test")


@dataclass(frozen=True)
class Problem:
    task: str
    key: str  # canonical skeleton; determines the split
    prompt: str
    reference: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def split_of(task: str, key: str) -> str:
    h = int.from_bytes(hashlib.sha256(f"{task}\x00{key}".encode()).digest()[:8], "big") % 100
    if h < 80:
        return "train"
    if h < 90:
        return "calib"
    return "test"


def _rng(task: str, split: str, seed: int) -> random.Random:
    digest = hashlib.sha256(f"{task}|{split}|{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def sample_split(task: str, make: Callable[[random.Random], Problem], split: str, n: int, seed: int,
                 unique: bool | None = None) -> list[Problem]:
    """n problems of ``split`` (rejection sampling on the skeleton hash). Held-out splits are unique
    by default; train may repeat skeletons (the space is sampled with replacement)."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
    if unique is None:
        unique = split != "train"
    rng = _rng(task, split, seed)
    out: list[Problem] = []
    seen: set[str] = set()
    attempts = 0
    limit = max(1000, 200 * n)
    while len(out) < n:
        attempts += 1
        if attempts > limit:
            raise RuntimeError(f"{task}/{split}: could only find {len(out)} of {n} problems")
        p = make(rng)
        if split_of(task, p.key) != split:
            continue
        if unique:
            if p.key in seen:
                continue
            seen.add(p.key)
        out.append(p)
    return out
