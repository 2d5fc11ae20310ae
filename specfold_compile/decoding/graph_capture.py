"""Capturing one call into a CUDA graph and replaying it: what ``VerifyGraphs`` and the serving engine's
graphs are built on. A call is run once before its capture (compiles, autotunes, warms), captured in a
shared memory pool with the garbage collector held off, then replayed once so that its output is a
replay's; ``replay="eager"`` runs the same bookkeeping with the call itself in place of a graph."""

from __future__ import annotations

import gc

import torch
from torch import Tensor

__all__ = ["capture_call", "record_call"]


def _copy_outputs(out, new) -> None:
    """``new`` into ``out``: a tensor, or a tuple of tensors and Nones (a write's logits)."""
    if isinstance(out, Tensor):
        out.copy_(new)
        return
    for o, n in zip(out, new):
        if o is not None:
            o.copy_(n)


def record_call(call, device: torch.device, replay: str, pool, restore: Tensor | tuple[Tensor, ...] | None = None):
    """``call``'s output and a function that runs it again: a replay of its CUDA graph in memory pool
    ``pool`` (``replay="eager"``: ``call`` itself, its output copied into the first one's). The call is
    run once before the capture (compiles, autotunes, warms; on a side stream, as torch.cuda.graph's recipe
    asks) and once by a replay after it, whose output is this call's: a call that updates ``restore`` (a
    tensor or a tuple of them) in place (a block write advances the device length) gets it back between
    the two."""
    if replay == "eager":
        out = call()
        return out, lambda: _copy_outputs(out, call())
    restore = () if restore is None else (restore,) if isinstance(restore, Tensor) else tuple(restore)
    saved = [t.clone() for t in restore]

    def put_back():
        for t, value in zip(restore, saved):
            t.copy_(value)

    return capture_call(call, device, pool, put_back)


def capture_call(call, device: torch.device, pool, between=None):
    """``call``'s output and its CUDA graph's replay: ``call`` run once on a side stream (compiles,
    autotunes, warms, as torch.cuda.graph's recipe asks), ``between()`` (if given) run after that, then
    ``call`` captured into a graph in memory pool ``pool`` and replayed once, so the output returned is a
    replay's (the capture only records the kernels). The garbage collector is held off during the
    capture: an unreachable graph freed then (an engine's, say) would end the capture with an error."""
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream(device).wait_stream(side)
    if between is not None:
        between()
    cuda_graph = torch.cuda.CUDAGraph()
    collecting = gc.isenabled()
    gc.disable()  # torch.cuda.graph collects once before the capture begins
    try:
        with torch.cuda.graph(cuda_graph, pool=pool):
            out = call()
    finally:
        if collecting:
            gc.enable()
    cuda_graph.replay()
    return out, cuda_graph.replay
