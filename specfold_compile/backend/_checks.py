"""The value checks of the settings' fields, by kind: a one-line error naming the option, else the
normalised value (``check_value``)."""

from __future__ import annotations

import math
import os
from typing import Any

GATES = ("layer", "sublayer")
GATE_FLAGS = ("kernel", "graph")
KERNELS = ("auto", "torch", "triton")
LARGEST_BLOCK_R = 128  # the packed linear's largest row tile (kernels/packed_linear.py)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tau(label: str, value: Any) -> float:
    try:
        tau = float(value)
    except OverflowError:  # an int past float's range
        tau = math.inf
    except (TypeError, ValueError):
        tau = math.nan  # e.g. "abc" or None: reported below, naming the option
    if isinstance(value, bool) or math.isnan(tau) or tau < 0:
        raise ValueError(f"{label}: expected a number >= 0, got {value!r}")
    return tau


def _choice(choices: tuple[str, ...]):
    def check(label: str, value: Any) -> str:
        if value not in choices:
            raise ValueError(f"{label}: expected one of {choices}, got {value!r}")
        return value
    return check


def _check(ok, expected: str, convert=lambda v: v, error=ValueError):
    def check(label: str, value: Any):
        if not ok(value):
            raise error(f"{label}: expected {expected}, got {value!r}")
        return convert(value)
    return check


_CHECKS = {
    "tau": _tau,
    "gate": _choice(GATES),
    "gate_flags": _choice(GATE_FLAGS),
    "kernels": _choice(KERNELS),
    "bool": _check(lambda v: isinstance(v, bool), "a bool", error=TypeError),
    "bool_or_none": _check(lambda v: v is None or isinstance(v, bool), "a bool or None (auto)", error=TypeError),
    "path_or_none": _check(lambda v: v is None or isinstance(v, (str, os.PathLike)), "None or a path",
                           error=TypeError),
    "fraction": _check(lambda v: _number(v) and 0.0 <= v <= 1.0, "a number in [0, 1]", float),
    "fraction>0": _check(lambda v: _number(v) and 0.0 < v <= 1.0, "a number in (0, 1]", float),
    "us": _check(lambda v: _number(v) and 0.0 <= v < math.inf, "a finite number >= 0", float),
    "rate": _check(lambda v: _number(v) and 0.0 < v < math.inf, "a finite number > 0", float),
    "fold_min_branches": _check(lambda v: v is None or (_int(v) and v >= 1), "None (cost model) or an int >= 1"),
    "int>=-1": _check(lambda v: _int(v) and v >= -1, "an int >= -1"),
    "int>=0": _check(lambda v: _int(v) and v >= 0, "an int >= 0"),
    "int>=1": _check(lambda v: _int(v) and v >= 1, "an int >= 1"),
    "int>=2": _check(lambda v: _int(v) and v >= 2, "an int >= 2"),
    "min_block_r": _check(lambda v: _int(v) and 1 <= v <= LARGEST_BLOCK_R, f"an integer from 1 to {LARGEST_BLOCK_R}"),
}


def _fractions(label: str, value: Any) -> float | tuple[float, ...]:
    """One fraction in [0, 1], or a non-empty sequence of them (a tuple: the settings stay hashable)."""
    if _number(value) and 0.0 <= value <= 1.0:
        return float(value)
    if isinstance(value, (list, tuple)) and value and all(_number(v) and 0.0 <= v <= 1.0 for v in value):
        return tuple(float(v) for v in value)
    raise ValueError(f"{label}: expected a number in [0, 1] or a non-empty sequence of them (one a layer), "
                     f"got {value!r}")


_CHECKS["fractions"] = _fractions


def check_value(label: str, value: Any, kind: str) -> Any:
    """``value`` checked as a ``kind`` (a key of ``_CHECKS``); errors name ``label``."""
    return _CHECKS[kind](label, value)
