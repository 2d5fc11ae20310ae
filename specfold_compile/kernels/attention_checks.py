"""Input checks of the attention launchers (folded and ragged): one-line errors naming the argument and what
was expected, before any launch."""
from __future__ import annotations

import torch

from ._common import expect
from .attention_tuning import AttentionTuning
from .interpreter_bf16 import refuse_broken_bf16


def _check_last_contig(**ts):
    for name, t in ts.items():
        expect(t.stride(-1) == 1 or t.shape[-1] == 1, name, "a contiguous last dim", f"strides {tuple(t.stride())}")


def _check_prefix_len(prefix_len, q):
    """``prefix_len``: None or a one-element integer tensor on q's device (checked from its metadata only:
    its value stays on the device, for the kernels to load)."""
    if prefix_len is None:
        return
    expect(isinstance(prefix_len, torch.Tensor), "prefix_len", "a tensor (the device-side prefix length)",
           type(prefix_len).__name__)
    expect(prefix_len.dtype in (torch.int32, torch.int64), "prefix_len", "an int32 or int64 tensor", prefix_len.dtype)
    expect(prefix_len.dim() <= 1 and prefix_len.numel() == 1, "prefix_len", "one element (shape [] or [1])",
           tuple(prefix_len.shape))
    expect(prefix_len.device == q.device, "prefix_len", f"q's device {q.device}", prefix_len.device)


def _check_tuning(tuning, needed: bool = True) -> None:
    if needed or tuning is not None:
        expect(isinstance(tuning, AttentionTuning), "tuning", "an AttentionTuning (e.g. H200.attention from "
               "specfold_compile.ops.device_profile)", type(tuning).__name__)


def _check_block_inputs(q, k, v, slot):
    expect(q.dim() == 3, "q", "[R, Hq, D]", tuple(q.shape))
    R, Hq, D = q.shape
    expect(k.dim() == 3 and k.shape[0] == R and k.shape[-1] == D and Hq % max(k.shape[1], 1) == 0,
           "k", f"[{R}, Hkv, {D}] with Hkv dividing Hq = {Hq}", tuple(k.shape))
    expect(v.shape == k.shape, "v", f"k's shape {tuple(k.shape)}", tuple(v.shape))
    expect(k.dtype == q.dtype and v.dtype == q.dtype, "k, v", f"q's dtype {q.dtype}", (k.dtype, v.dtype))
    expect(slot.dim() == 2, "slot", "[N, B]", tuple(slot.shape))
    expect(slot.dtype in (torch.int32, torch.int64), "slot", "int32 or int64 row indices", slot.dtype)
    _check_last_contig(q=q, k=k, v=v)
    refuse_broken_bf16(q.dtype, "attention")
    return slot if slot.stride(-1) == 1 else slot.contiguous()


def _check_prefix_inputs(q, k_pre, v_pre, kv_heads: int | None = None):
    """k_pre, v_pre [Hkv, P, D] in q's dtype, Hkv dividing Hq (or equal to ``kv_heads``, the block's)."""
    Hq, D = q.shape[1], q.shape[-1]
    heads_ok = k_pre.dim() == 3 and (Hq % max(k_pre.shape[0], 1) == 0 if kv_heads is None
                                     else k_pre.shape[0] == kv_heads)
    expect(heads_ok and k_pre.shape[-1] == D, "k_pre",
           f"[Hkv, P, {D}] with Hkv dividing Hq = {Hq}" if kv_heads is None else f"[{kv_heads}, P, {D}] (k's kv heads)",
           tuple(k_pre.shape))
    expect(v_pre.shape == k_pre.shape, "v_pre", f"k_pre's shape {tuple(k_pre.shape)}", tuple(v_pre.shape))
    expect(k_pre.dtype == q.dtype and v_pre.dtype == q.dtype, "k_pre, v_pre", f"q's dtype {q.dtype}",
           (k_pre.dtype, v_pre.dtype))
    _check_last_contig(k_pre=k_pre, v_pre=v_pre)
    refuse_broken_bf16(q.dtype, "attention")


def _check_index(t, name: str, n: int, device) -> None:
    expect(isinstance(t, torch.Tensor), name, "an integer tensor", type(t).__name__)
    expect(t.dtype in (torch.int32, torch.int64), name, "an int32 or int64 tensor", t.dtype)
    expect(t.dim() == 1 and t.shape[0] == n, name, f"[{n}]", tuple(t.shape))
    expect(t.device == device, name, f"q's device {device}", t.device)


def check_pool_and_requests(q, q_name: str, Hkv: int, k_pool, v_pool, bounds, slots, lengths) -> None:
    """The pool's and the requests' checks of the ragged kernels: k_pool, v_pool [slots, Hkv, capacity, D]
    of ``q``'s dtype and device (``q_name`` names it in the errors), bounds / slots / lengths integer [n + 1]
    / [n] / [n] on its device (metadata only: their values stay on the device)."""
    D = q.shape[-1]
    expect(k_pool.dim() == 4 and k_pool.shape[1] == Hkv and k_pool.shape[-1] == D, "k_pool",
           f"[slots, {Hkv}, capacity, {D}]", tuple(k_pool.shape))
    expect(v_pool.shape == k_pool.shape, "v_pool", f"k_pool's shape {tuple(k_pool.shape)}", tuple(v_pool.shape))
    for name, t in (("k_pool", k_pool), ("v_pool", v_pool)):
        expect(t.dtype == q.dtype, name, f"{q_name}'s dtype {q.dtype}", t.dtype)
        expect(t.device == q.device, name, f"{q_name}'s device {q.device}", t.device)
    expect(isinstance(bounds, torch.Tensor) and bounds.dim() == 1 and bounds.shape[0] >= 2, "bounds",
           "[requests + 1] row offsets (bounds[0] = 0, bounds[-1] = R)",
           tuple(bounds.shape) if isinstance(bounds, torch.Tensor) else type(bounds).__name__)
    n_req = bounds.shape[0] - 1
    _check_index(bounds, "bounds", n_req + 1, q.device)
    _check_index(slots, "slots", n_req, q.device)
    _check_index(lengths, "lengths", n_req, q.device)
