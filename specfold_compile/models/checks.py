"""The verification forward's input checks: shapes, dtypes, devices and the prefix cache
(``check_input_shapes``), and the data (token ids, parent order, logit positions: ``check_values``).

Every check raises a one-line error naming the argument and what was expected. They run on the host,
outside any traced graph (``BlockDiffusionLM.check_inputs`` is ``torch.compiler.disable``), so a compiled
model rejects bad data exactly as the eager one does.

The data checks read values back to the host: one synchronisation per forward. A decode loop whose steps
build their rows on the device (``decoding.device_loop``: valid by construction, and tested to equal the
Python loop's) runs its forwards inside ``loop_built_rows()``, which skips them, as a CUDA-graph capture
does; the shape checks still run. Both decode loops write their finished blocks inside it too, which
skips ``check_block``'s id check (the block's ids are the loop's own argmaxes).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .cache import PrefixCache, check_cache_owner
from .config import ModelConfig
from .loop_built import in_loop_built_rows, loop_built_rows

__all__ = ["check_input_shapes", "check_values", "validate_parents", "loop_built_rows", "in_loop_built_rows"]


def check_input_shapes(config: ModelConfig, model_uid: int, num_layers: int, tokens: Tensor, parents: Tensor,
                       cache: PrefixCache, logit_positions: Tensor | None) -> None:
    """Shape, dtype and device checks of one verification call (no value is read back from the device)."""
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.dtype != torch.int64:
        raise TypeError(f"tokens: expected an int64 tensor [N, B], got "
                        f"{getattr(tokens, 'dtype', type(tokens))} of shape {tuple(getattr(tokens, 'shape', ()))}")
    if not isinstance(parents, Tensor) or parents.dim() != 1 or parents.dtype != torch.int64:
        raise TypeError(f"parents: expected an int64 tensor [N], got {getattr(parents, 'dtype', type(parents))}")
    if parents.shape[0] != tokens.shape[0]:
        raise ValueError(f"parents: expected length N={tokens.shape[0]} (rows of tokens), got {parents.shape[0]}")
    check_cache_owner(cache, model_uid)
    if len(cache.keys) != num_layers or len(cache.values) != num_layers:
        raise ValueError(f"cache: expected {num_layers} layers, got {len(cache.keys)}")
    # (Outside the traced graph, reading a static cache's host length specialises nothing.)
    if cache.device_length is not None and cache.device_length.device != tokens.device:
        raise ValueError(f"cache: device_length must be on the device of tokens ({tokens.device}), got "
                         f"{cache.device_length.device}")
    if cache.length + tokens.shape[1] > config.max_position_embeddings:
        raise ValueError(f"cache: prefix length {cache.length} + block {tokens.shape[1]} exceeds "
                         f"max_position_embeddings={config.max_position_embeddings}")
    if logit_positions is not None and (not isinstance(logit_positions, Tensor) or logit_positions.dim() != 1
                                        or logit_positions.dtype != torch.int64):
        raise TypeError(f"logit_positions: expected None or an int64 tensor [M] of flat positions n * B + p, "
                        f"got {getattr(logit_positions, 'dtype', type(logit_positions))} of shape "
                        f"{tuple(getattr(logit_positions, 'shape', ()))}")
    if logit_positions is not None and logit_positions.device != tokens.device:
        raise ValueError(f"logit_positions: expected the device of tokens ({tokens.device}), got "
                         f"{logit_positions.device}")


def check_values(tokens: Tensor, parents: Tensor, logit_positions: Tensor | None, vocab_size: int) -> None:
    """The data checks of ``check_inputs``: token ids in [0, vocab_size), parents in topological order,
    ``logit_positions`` in [0, N * B). One read back to the host for all of them; skipped while a CUDA
    graph is being captured (a read back is not allowed there) and inside ``loop_built_rows()``."""
    if in_loop_built_rows() or (tokens.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    if parents.numel() == 0 or tokens.numel() == 0:
        validate_parents(parents)  # no rows: names parents; rows of width 0 hold no ids to check
        return
    n_rows = parents.shape[0]
    rows = torch.arange(1, n_rows, device=parents.device)
    parents_ok = (parents[0] == -1) & ((parents[1:] >= 0) & (parents[1:] < rows)).all()
    stats = [tokens.min(), tokens.max(), parents_ok.to(device=tokens.device, dtype=torch.int64)]
    if logit_positions is not None and logit_positions.numel():
        stats += [logit_positions.min(), logit_positions.max()]
    values = torch.stack(stats).tolist()
    if not values[2]:
        validate_parents(parents)  # raises, naming the first bad row
    if len(values) > 3 and (values[3] < 0 or values[4] >= tokens.numel()):
        raise ValueError(f"logit_positions: flat positions must lie in [0, N * B = {tokens.numel()}), "
                         f"got [{values[3]}, {values[4]}]")
    if values[0] < 0 or values[1] >= vocab_size:
        raise ValueError(f"tokens: ids must lie in [0, {vocab_size}), got [{values[0]}, {values[1]}]")


def validate_parents(parents: Tensor) -> None:
    """parents[0] == -1 and 0 <= parents[n] < n for n >= 1 (rows in topological order)."""
    values = parents.tolist()
    if not values:
        raise ValueError("parents: expected at least one row (the main branch)")
    if values[0] != -1:
        raise ValueError(f"parents: parents[0] must be -1 (row 0 is the main branch), got {values[0]}")
    for n, p in enumerate(values[1:], start=1):
        if not 0 <= p < n:
            raise ValueError(f"parents: parents[{n}] must lie in [0, {n}) (rows in topological order), got {p}")
