"""Which sizes of a verification call a compiled model should trace as dynamic."""

from __future__ import annotations

import torch

__all__ = ["mark_dynamic_shapes", "mark_dynamic_keys"]


def mark_dynamic_shapes(tokens: torch.Tensor, parents: torch.Tensor, cache,
                        logit_positions: torch.Tensor | None = None) -> None:
    """The branch count, the prefix length and the number of masked positions change from call to call:
    mark them so a compiled model traces them as dynamic from the start (one graph per size class, not
    one per size). N = 1 stays specialised, as torch.compile specialises sizes 0 and 1 anyway. The block
    length is the model's constant and the folded forward needs it static: marked so, since Dynamo would
    otherwise generalise it once the same forward code has run with another block length (a second model
    of another config in the process) and the backend would then run that graph unfolded."""
    torch._dynamo.mark_static(tokens, 1)
    if parents.numel() > 1:
        torch._dynamo.maybe_mark_dynamic(tokens, 0)
        torch._dynamo.maybe_mark_dynamic(parents, 0)
    if logit_positions is not None and logit_positions.numel() > 1:
        torch._dynamo.maybe_mark_dynamic(logit_positions, 0)
    mark_dynamic_keys(cache)


def mark_dynamic_keys(cache) -> None:
    """A prefix cache's key length (its keys and values [Hkv, P, D]) as dynamic: the prefix grows, and a
    static cache's windows (``VerifyGraphs``) cut its buffers to different lengths."""
    for t in (*getattr(cache, "keys", ()), *getattr(cache, "values", ())):
        if isinstance(t, torch.Tensor) and t.dim() == 3 and t.shape[1] > 1:
            torch._dynamo.maybe_mark_dynamic(t, 1)
