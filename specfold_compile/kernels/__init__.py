"""Triton kernels of the folded verification forward, each with a pure-torch reference twin.

Importing this package never requires triton or a GPU: the references are always available, and
the Triton launchers are imported only when triton is importable. ``triton_available()`` says
whether the launchers can run here (a CUDA device, or the interpreter via TRITON_INTERPRET=1).
Set TRITON_INTERPRET before importing this package when running the kernels on CPU.
"""
from __future__ import annotations

import os

from .attention_tuning import AttentionTuning
from .attention_ref import (
    block_attention_ref,
    branch_attention_ref,
    merge_split_states,
    merge_states,
    prefix_attention_ref,
)
from .folded_ragged_attention_ref import folded_ragged_attention_ref
from .gate_ref import fold_flags_ref, fold_gate_from_flags_ref, fold_gate_ref, resolve_folds_ref
from .packed_linear_ref import packed_linear_ref
from .ragged_attention_ref import ragged_attention_ref
from .swiglu_ref import silu_mul_ref

try:  # pragma: no cover - depends on the environment
    import triton  # noqa: F401

    _TRITON_IMPORT_ERROR: Exception | None = None
except Exception as exc:  # ImportError, or a broken install
    _TRITON_IMPORT_ERROR = exc

if _TRITON_IMPORT_ERROR is None:
    from .attention import (
        block_attention, branch_attention, one_pass_attention, prefix_attention, prefix_attention_states,
        slot_attention,
    )
    from .folded_ragged_attention import folded_ragged_attention
    from .gate import fold_gate, fold_gate_from_flags, resolve_folds
    from .interpreter_bf16 import refuse_broken_bf16
    from .packed_linear import packed_linear
    from .ragged_attention import ragged_attention
    from .swiglu import silu_mul
else:
    def _missing(name):
        def fn(*args, **kwargs):
            raise RuntimeError(f"{name} needs triton, which failed to import: {_TRITON_IMPORT_ERROR!r}")
        fn.__name__ = name
        return fn

    fold_gate = _missing("fold_gate")

    def refuse_broken_bf16(dtype, what):  # no Triton kernel can run: nothing to refuse
        return None
    fold_gate_from_flags = _missing("fold_gate_from_flags")
    resolve_folds = _missing("resolve_folds")
    prefix_attention = _missing("prefix_attention")
    prefix_attention_states = _missing("prefix_attention_states")
    block_attention = _missing("block_attention")
    branch_attention = _missing("branch_attention")
    one_pass_attention = _missing("one_pass_attention")
    slot_attention = _missing("slot_attention")
    packed_linear = _missing("packed_linear")
    ragged_attention = _missing("ragged_attention")
    folded_ragged_attention = _missing("folded_ragged_attention")
    silu_mul = _missing("silu_mul")


def interpreting() -> bool:
    """Triton's CPU interpreter is on (TRITON_INTERPRET set and not 0)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_available() -> bool:
    """True when the Triton launchers can run: triton imports and either a CUDA device is present
    or the interpreter is enabled (TRITON_INTERPRET=1)."""
    if _TRITON_IMPORT_ERROR is not None:
        return False
    if interpreting():
        return True
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


__all__ = [
    "triton_available", "interpreting", "refuse_broken_bf16", "AttentionTuning",
    "fold_gate", "fold_gate_from_flags", "resolve_folds", "fold_gate_ref", "fold_flags_ref", "resolve_folds_ref",
    "fold_gate_from_flags_ref",
    "prefix_attention", "prefix_attention_states", "block_attention", "branch_attention", "one_pass_attention",
    "slot_attention",
    "prefix_attention_ref", "block_attention_ref", "branch_attention_ref", "merge_states", "merge_split_states",
    "packed_linear", "packed_linear_ref", "silu_mul", "silu_mul_ref", "ragged_attention", "ragged_attention_ref",
    "folded_ragged_attention", "folded_ragged_attention_ref",
]
