"""Pure-torch twin of ``folded_ragged_attention.py``: the packed rows expanded to every position through
``slot`` (each position takes its origin's q, k, v), then ``ragged_attention_ref``'s one softmax over the
request's prefix and the branch's own block, in float32."""
from __future__ import annotations

from .ragged_attention_ref import ragged_attention_ref


def folded_ragged_attention_ref(q_p, k_p, v_p, rows, slot, k_pool, v_pool, bounds, slots, lengths, scale):
    """q_p [P, Hq, D], k_p, v_p [P, Hkv, D], rows [P] (unused: the expansion needs only ``slot``), slot
    [R, B]; the pool and index tensors as ``ragged_attention_ref`` -> [R, B, Hq, D] in q_p.dtype."""
    slot = slot.long()
    return ragged_attention_ref(q_p[slot], k_p[slot], v_p[slot], k_pool, v_pool, bounds, slots, lengths, scale)
