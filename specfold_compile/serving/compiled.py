"""The engine's position-wise layer pieces compiled by ``torch.compile`` (``Engine(compile_layers=...)``).

The batched passes run each ``DecoderLayer``'s ``POSITION_WISE`` methods over the rows of every request
at once (``forward``'s module docstring): the norms, q/k/v projections, RoPE, output projection and MLP,
the parts that see one position at a time. ``compiled_model(model, backend)`` gives a view of ``model``
whose ``layers`` run those methods compiled with dynamic shapes (``dynamic=True``: the row count changes
every step, and with dynamic shapes one graph serves every count and every layer); attention (the
ragged kernel or ``ops.branch_attention``), the embedding, the final norm and the LM head stay as they
are. A folded forward runs ``reference.FOLDED_PIECES`` compiled the same way (``folded_pieces``).
Inductor fuses each piece's pointwise ops (RMSNorm, RoPE, SiLU-and-multiply) around the GEMMs, which
eagerly are a launch each.

The view changes nothing in ``model``: its parameters, modules and methods are the model's own (a
``ModelView`` forwards every attribute but ``layers`` to it), so the same model can serve a compiled
engine and a plain one. The compiled functions are made once per backend and class and shared by every
view, so a second engine reuses what the first compiled. A compiled piece computes the eager piece's
function; its numbers differ by the fused kernels' rounding (float32 on the CPU: to a few ulps).
"""

from __future__ import annotations

import functools

import torch

from ..models.layers import PositionTables
from ..reference import FOLDED_PIECES, PACKED_ATTENTION_PIECES, fold_test

__all__ = ["POSITION_WISE", "ModelView", "compiled_model", "check_compile_layers", "check_packed_attention",
           "base_model", "folded_pieces", "gate_test"]

POSITION_WISE = ("qkv", "attn_out", "mlp_out")  # DecoderLayer's pieces the passes run over all rows at once


def check_compile_layers(value) -> str | None:
    """``compile_layers``: False (eager), True (Inductor) or the name of a ``torch.compile`` backend;
    returns the backend's name, None for eager (a one-line error naming the argument otherwise)."""
    if value is False or value is None:
        return None
    if value is True:
        return "inductor"
    if isinstance(value, str) and value in torch._dynamo.list_backends(exclude_tags=()):
        return value
    raise ValueError(f"compile_layers: expected False, True (Inductor) or a torch.compile backend name "
                     f"(torch._dynamo.list_backends()), got {value!r}")


def check_packed_attention(value, attention: str = "ragged") -> bool:
    """``packed_attention``: True or False, True only over the ragged attention (``folded_pieces``'
    packed q, k, v go to ``ops.folded_ragged_attention``); a one-line error naming the argument otherwise."""
    if not isinstance(value, bool):
        raise ValueError(f"packed_attention: expected True or False, got {value!r}")
    if value and attention != "ragged":
        raise ValueError(f"packed_attention: True needs attention='ragged', got attention={attention!r}")
    return value


@functools.cache
def _compiled(fn, backend: str):
    """``fn`` compiled once for every layer, view and engine (a method unbound, the layer its argument)."""
    return torch.compile(fn, dynamic=True, backend=backend)


class _LayerView:
    """A decoder layer whose ``POSITION_WISE`` methods are compiled; every other attribute is the layer's."""

    def __init__(self, layer, backend: str):
        self._layer = layer
        for name in POSITION_WISE:
            setattr(self, name, functools.partial(_compiled(getattr(type(layer), name), backend), layer))

    def __getattr__(self, name):
        return getattr(self._layer, name)


class ModelView:
    """``model`` with ``layers`` compiled (``_LayerView`` each); every other attribute is the model's."""

    def __init__(self, model, backend: str):
        self.model, self.backend = model, backend
        self.layers = [_LayerView(layer, backend) for layer in model.layers]

    def __getattr__(self, name):
        return getattr(self.model, name)


def compiled_model(model, backend: str | None):
    """What the passes run: ``model`` itself for ``backend=None``, else its ``ModelView``."""
    return model if backend is None else ModelView(model, backend)


@functools.cache
def _qkv_of_tensors(piece):
    """The qkv ``piece`` (``packed_qkv`` or ``packed_qkv_rows``) with the tables' tensors as arguments of
    their own: ``dynamic=True`` makes them dynamic from the first compile (a dataclass's tensors would take
    one recompile). One function a piece, so its compile is shared too."""
    def qkv(layer, h, rows, slot, cos, sin, q_scale):
        return piece(layer, h, rows, slot, PositionTables(cos, sin, q_scale))
    return qkv


@functools.cache
def _compiled_pieces(backend: str, packed_attention: bool):
    qkv_piece, attn_out, mlp = PACKED_ATTENTION_PIECES if packed_attention else FOLDED_PIECES
    qkv, attn_out, mlp = (_compiled(fn, backend) for fn in (_qkv_of_tensors(qkv_piece), attn_out, mlp))

    def packed_qkv_compiled(layer, h, rows, slot, tables):
        return qkv(layer, h, rows, slot, tables.cos, tables.sin, tables.q_scale)
    return packed_qkv_compiled, attn_out, mlp


def folded_pieces(model, packed_attention: bool = False):
    """The layers and position-wise pieces a folded forward of ``model`` runs (``reference.folded_layers``):
    the model's layers and ``reference.FOLDED_PIECES`` (``packed_attention``: ``PACKED_ATTENTION_PIECES``,
    q, k, v left packed for an attention over the packed rows); under a ``ModelView`` the model's own layers
    and the pieces compiled whole, each one graph for every layer and row count, so that the packed rows'
    gathers (the residuals, the RoPE tables and each position's origin's q, k, v and MLP output) fuse with
    the norms, RoPE and residual adds around the GEMMs."""
    if isinstance(model, ModelView):
        return model.model.layers, _compiled_pieces(model.backend, bool(packed_attention))
    return model.layers, PACKED_ATTENTION_PIECES if packed_attention else FOLDED_PIECES


def gate_test(model):
    """The fold test the engine's gates run (``reference.fold_test``), compiled under a ``ModelView``: one
    or two fused kernels a gate where the eager test launches seven or eight ops. Its float32 norms may
    round otherwise than the eager ones, so a position within rounding of ``tau`` may fold one way or the
    other (as the compiled pieces' numbers differ by rounding)."""
    return _compiled(fold_test, model.backend) if isinstance(model, ModelView) else fold_test


def base_model(model):
    """The model under a ``ModelView`` (the model itself otherwise)."""
    return model.model if isinstance(model, ModelView) else model
