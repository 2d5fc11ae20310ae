"""SpecFold decoding's verification forward: the model compiled with the ``specfold`` backend.

``generate(model, ids, mode="specfold", tau=...)`` decodes as Spiffy does, each verification call going
through ``specfold_forward(model, tau, options)``: ``torch.compile(model, backend="specfold",
options={"tau": tau, **options})``, made on first use and kept on the model per (tau, options), so
every later call with the same options reuses its compiled graphs. The backend is reached through its
registered name (the ``torch_dynamo_backends`` entry point), so decoding imports nothing of it; the
backend validates the other options when it compiles the first call.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..models.protocol import DecodingModel, VerifyForward

__all__ = ["specfold_forward", "verification_forward", "check_tau", "check_specfold_options"]

_CACHE_ATTR = "_specfold_forwards"  # in the model's __dict__, out of its state_dict and submodules


def check_tau(tau: Any) -> float | None:
    """``tau`` as a float (None: the backend's default): a number >= 0, or a one-line ValueError."""
    if tau is None:
        return None
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or math.isnan(tau) or tau < 0:
        raise ValueError(f"tau: expected a number >= 0 (the fold threshold; 0 folds nothing), got {tau!r}")
    return float(tau)


def check_specfold_options(options: Any) -> dict:
    """The backend options besides tau, as a dict (None: none)."""
    if options is None:
        return {}
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise TypeError(f"specfold_options: expected None or a dict of backend options by name, got "
                        f"{type(options).__name__}")
    if "tau" in options:
        raise ValueError("specfold_options: pass the fold threshold as tau=, not in specfold_options")
    try:
        hash(tuple(sorted(options.items())))
    except TypeError:
        raise TypeError("specfold_options: expected hashable option values (the compiled forward is kept per "
                        "options)") from None
    return dict(options)


def specfold_forward(model: DecodingModel, tau: float | None = None, options: dict | None = None) -> VerifyForward:
    """``model``'s verification forward compiled with the ``specfold`` backend at ``tau`` (None: the
    backend's default) and the other backend ``options``; the same object for the same model, tau and
    options (module docstring). What ``generate(mode="specfold")`` verifies with, and what a command line
    passes to ``VerifyGraphs(model, forward=...)`` to keep its graphs across prompts."""
    tau = check_tau(tau)
    options = check_specfold_options(options)
    key = (tau, tuple(sorted(options.items())))
    forwards = model.__dict__.setdefault(_CACHE_ATTR, {})
    if key not in forwards:
        full = dict(options) if tau is None else {"tau": tau, **options}
        forwards[key] = torch.compile(model, backend="specfold", options=full)
    return forwards[key]


def verification_forward(model: DecodingModel, mode: str, tau, specfold_options) -> VerifyForward:
    """What the decode loop verifies with: the model, or (``mode="specfold"``) its SpecFold-compiled forward."""
    if mode == "specfold":
        return specfold_forward(model, tau, specfold_options)
    check_tau(tau)
    check_specfold_options(specfold_options)
    if tau is not None or specfold_options is not None:
        raise ValueError(f"{'tau' if tau is not None else 'specfold_options'}: only mode='specfold' compiles the "
                         f"model, got mode={mode!r}")
    return model
