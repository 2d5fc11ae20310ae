"""The checks of ``Engine``'s plain arguments: each bad value refused with a one-line error naming the
argument and what was expected (the model, graphs and compile arguments are checked by their modules)."""

from __future__ import annotations

from ..decoding.defaults import CONFIDENCE_DTYPES
from ..decoding.specfold import check_tau

SERVING_MODES = ("vanilla", "spiffy", "specfold")


def _count(value, least: int) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= least)


def check_engine_args(mode, tau, confidence_dtype: str, max_waiting, max_verify_rows, loop: str,
                      compile_step) -> float | None:
    """Raises ``ValueError`` on the first bad argument; returns ``tau`` checked (``check_tau``)."""
    if loop not in ("host", "device"):
        raise ValueError(f"loop: expected 'host' or 'device', got {loop!r}")
    if compile_step is not None and not isinstance(compile_step, (bool, str)):
        raise ValueError(f"compile_step: expected None, a bool or a torch.compile backend's name, got {compile_step!r}")
    if compile_step not in (None, False) and loop != "device":
        raise ValueError("compile_step: only loop='device' runs a step's bookkeeping as tensor ops")
    if not _count(max_verify_rows, 1):
        raise ValueError(f"max_verify_rows: expected None or an int >= 1, got {max_verify_rows!r}")
    if not isinstance(mode, str) or mode not in SERVING_MODES:
        raise ValueError(f"mode: expected one of {SERVING_MODES}, got {mode!r}")
    tau = check_tau(tau)
    if mode == "specfold" and tau is None:
        raise ValueError("tau: mode='specfold' needs the fold threshold, a number >= 0 (0 folds nothing)")
    if mode != "specfold" and tau is not None:
        raise ValueError(f"tau: only mode='specfold' folds, got mode={mode!r}")
    if not isinstance(confidence_dtype, str) or confidence_dtype not in CONFIDENCE_DTYPES:
        raise ValueError(f"confidence_dtype: expected one of {CONFIDENCE_DTYPES}, got {confidence_dtype!r}")
    if not _count(max_waiting, 0):
        raise ValueError(f"max_waiting: expected None or an int >= 0, got {max_waiting!r}")
    return tau
