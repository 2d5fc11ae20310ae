"""The engine's position-wise layer pieces compiled by ``torch.compile`` (``Engine(compile_layers=...)``).

The batched passes run each ``DecoderLayer``'s ``POSITION_WISE`` methods over the rows of every request
at once (``forward``'s module docstring): the norms, q/k/v projections, RoPE, output projection and MLP,
the parts that see one position at a time. ``compiled_model(model, backend)`` gives a view of ``model``
whose ``layers`` run those methods compiled with dynamic shapes (``dynamic=True``: the row count changes
every step, and with dynamic shapes one graph serves every count and every layer); attention (the
ragged kernel or ``ops.branch_attention``), the embedding, the final norm and the LM head stay as they
are. Inductor fuses each piece's pointwise ops (RMSNorm, RoPE, SiLU-and-multiply) around the GEMMs,
which eagerly are a launch each.

The view changes nothing in ``model``: its parameters, modules and methods are the model's own (a
``ModelView`` forwards every attribute but ``layers`` to it), so the same model can serve a compiled
engine and a plain one. The compiled functions are made once per backend and class and shared by every
view, so a second engine reuses what the first compiled. A compiled piece computes the eager piece's
function; its numbers differ by the fused kernels' rounding (float32 on the CPU: to a few ulps).
"""

from __future__ import annotations

import functools

import torch

__all__ = ["POSITION_WISE", "ModelView", "compiled_model", "check_compile_layers", "base_model"]

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


@functools.cache
def _compiled_piece(cls: type, name: str, backend: str):
    """``cls.name`` (an unbound method) compiled once for every layer of that class and every view."""
    return torch.compile(getattr(cls, name), dynamic=True, backend=backend)


class _LayerView:
    """A decoder layer whose ``POSITION_WISE`` methods are compiled; every other attribute is the layer's."""

    def __init__(self, layer, backend: str):
        self._layer = layer
        for name in POSITION_WISE:
            setattr(self, name, functools.partial(_compiled_piece(type(layer), name, backend), layer))

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


def base_model(model):
    """The model under a ``ModelView`` (the model itself otherwise)."""
    return model.model if isinstance(model, ModelView) else model
