"""Every Triton launcher rejects bad input with a ValueError that names the argument and says what it
expected (no AssertionError, nothing launched on a wrong shape)."""
import pytest
import torch

pytest.importorskip("triton")

from specfold_compile.kernels import (  # noqa: E402
    block_attention, fold_gate, fold_gate_from_flags, packed_linear, prefix_attention_states, resolve_folds,
)
from specfold_compile.testing import DEVICE  # noqa: E402


def t(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape))).to(dtype)


GOOD_Q, GOOD_K = t(3, 4, 8), t(2, 5, 8)  # q [R, Hq, D], k_pre [Hkv, P, D]


@pytest.mark.parametrize("kwargs, name", [
    (dict(q=t(3, 4), k_pre=GOOD_K, v_pre=GOOD_K), "q"),
    (dict(q=GOOD_Q, k_pre=t(2, 5, 16), v_pre=t(2, 5, 16)), "k_pre"),
    (dict(q=GOOD_Q, k_pre=t(3, 5, 8), v_pre=t(3, 5, 8)), "k_pre"),  # 3 kv heads do not divide 4 query heads
    (dict(q=GOOD_Q, k_pre=GOOD_K, v_pre=t(2, 6, 8)), "v_pre"),
    (dict(q=t(3, 8, 4)[:, :4].transpose(1, 2), k_pre=t(2, 5, 4), v_pre=t(2, 5, 4)), "q"),  # strided last dim
])
def test_prefix_attention_states_names_the_bad_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}: expected"):
        prefix_attention_states(scale=0.3, **kwargs)


def _block_args(**override):
    R, Hq, Hkv, D = 4, 4, 2, 8
    args = dict(q=t(R, Hq, D), k=t(R, Hkv, D), v=t(R, Hkv, D), slot=torch.arange(R).view(2, 2),
                o_pre=t(R, Hq, D), lse_pre=t(R, Hq), scale=0.3)
    args.update(override)
    return args


@pytest.mark.parametrize("override, name", [
    (dict(q=t(4, 4)), "q"),
    (dict(k=t(3, 2, 8)), "k"),
    (dict(k=t(4, 3, 8), v=t(4, 3, 8)), "k"),
    (dict(v=t(4, 2, 16)), "v"),
    (dict(slot=torch.arange(4)), "slot"),
    (dict(o_pre=t(4, 4, 16)), "o_pre"),
    (dict(lse_pre=t(4, 3)), "lse_pre"),
])
def test_block_attention_names_the_bad_argument(override, name):
    with pytest.raises(ValueError, match=f"^{name}: expected"):
        block_attention(**_block_args(**override))


def test_fold_gate_names_the_bad_argument():
    tau = torch.tensor(0.1)
    with pytest.raises(ValueError, match="^h: expected"):
        fold_gate(t(3, 8), torch.zeros(3, dtype=torch.int64), tau)
    with pytest.raises(ValueError, match="^parents: expected"):
        fold_gate(t(3, 2, 8), torch.zeros(2, dtype=torch.int64), tau)


@pytest.mark.parametrize("resolve", [resolve_folds, fold_gate_from_flags])
def test_origin_resolution_names_the_bad_argument(resolve):
    fold = torch.zeros(3, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="^fold: expected"):
        resolve(torch.zeros(12, dtype=torch.bool), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="^parents: expected"):
        resolve(fold, torch.zeros(2, dtype=torch.int64))
    chain = torch.tensor([[0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 0, 0]], dtype=torch.bool, device=DEVICE)
    ok = resolve(chain, torch.tensor([0, 0, 1], dtype=torch.int32, device=DEVICE))  # other integer dtypes
    ref = resolve(chain, torch.tensor([0, 0, 1], dtype=torch.int64, device=DEVICE))  # are converted
    assert all(torch.equal(a, b) for a, b in zip(ok, ref))


def test_gate_capacity_names_the_bad_argument():
    fold, parents = torch.zeros(3, 4, dtype=torch.bool), torch.tensor([-1, 0, 1])
    flag = torch.zeros((), dtype=torch.bool)
    bad = [(dict(fold_rows=torch.zeros(2, dtype=torch.bool)), "fold_rows"),
           (dict(fold_rows=torch.zeros(3, dtype=torch.int64)), "fold_rows"),
           (dict(capacity=0, overflow_flag=flag), "capacity"), (dict(capacity=True, overflow_flag=flag), "capacity"),
           (dict(capacity=4.0, overflow_flag=flag), "capacity"), (dict(capacity=4), "overflow_flag"),
           (dict(overflow_flag=flag), "overflow_flag"),
           (dict(capacity=4, overflow_flag=torch.zeros(1, dtype=torch.int32)), "overflow_flag")]
    for kwargs, name in bad:
        with pytest.raises(ValueError, match=f"^{name}: expected"):
            fold_gate_from_flags(fold, parents, **kwargs)


def test_packed_linear_names_the_bad_argument():
    x, w = t(5, 8), t(6, 8)
    with pytest.raises(ValueError, match="^weight: expected"):
        packed_linear(x, t(6, 7), None, None, min_block_r=64)
    with pytest.raises(ValueError, match="^bias: expected"):
        packed_linear(x, w, t(5), None, min_block_r=64)
    with pytest.raises(ValueError, match="^row_start: expected"):
        packed_linear(x, w, None, None, min_block_r=64, row_start=6)
    with pytest.raises(ValueError, match="^out: expected"):
        packed_linear(x, w, None, None, min_block_r=64, out=torch.empty(5, 5))
    with pytest.raises(ValueError, match="^min_block_r: expected"):
        packed_linear(x, w, None, None, min_block_r=0)
