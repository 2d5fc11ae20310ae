"""The replayed SpecFold forward's gates (``serving.capacity_gates.CapacityGates``): the Triton resolve
kernel gives what the tensor ops give (fold masks, packed rows, slots, overflow), on random batches of
several requests with padding rows, gated or forced; the engine decoding alike with either; and
``gate_kernel`` is checked."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch.utils._python_dispatch import TorchDispatchMode

from specfold_compile import kernels, ops
from specfold_compile.kernels.gate_ref import safe_parents
from specfold_compile.reference import fold_test
from specfold_compile.serving import Engine, RequestParams
from specfold_compile.serving.capacity_gates import KERNEL_TILE_MAX, CapacityGates, check_gate_kernel
from specfold_compile.serving.graphs import BatchGraphs
from specfold_compile.testing import TINY_FAMILIES, tiny_model

needs_triton = pytest.mark.skipif(not kernels.triton_available(), reason="needs triton (TRITON_INTERPRET=1 on CPU)")


def _batch(draw_counts, pad, seed):
    """Offset parents of requests with ``draw_counts`` rows each (a main row, then drafts on earlier rows of
    the same request), ``pad`` padding rows folding into row 0, as ``BatchGraphs.verify`` lays them out."""
    g = torch.Generator().manual_seed(seed)
    parents, start = [], 0
    for count in draw_counts:
        parents.append(-1)
        parents += [start + int(torch.randint(0, n, (), generator=g)) for n in range(1, count)]
        start += count
    parents += [0] * pad
    pad_rows = torch.tensor([False] * start + [True] * pad)
    return torch.tensor(parents), pad_rows


def _gate_both(parents, pad_rows, block, h, tau, capacity, forced):
    out = []
    for resolve_kernel in (False, True):
        gates = CapacityGates(parents, block, len(parents) - 1, torch.tensor(tau), capacity, pad_rows, forced,
                              resolve_kernel)
        steps = [gates(x) for x in h]
        out.append((steps, gates.masks, bool(gates.overflow)))
    return out


@needs_triton
@settings(max_examples=25, deadline=None)
@given(counts=st.lists(st.integers(1, 5), min_size=1, max_size=4), pad=st.integers(0, 3),
       block=st.sampled_from([2, 4, 8]), tau=st.floats(0.0, 1.5), forced=st.booleans(),
       share=st.floats(0.1, 1.0), seed=st.integers(0, 2**31 - 1))
def test_resolve_kernel_matches_tensor_ops(counts, pad, block, tau, forced, share, seed):
    parents, pad_rows = _batch(counts, pad, seed)
    rows, gates = len(parents), 3
    g = torch.Generator().manual_seed(seed + 1)
    # residual streams where drafts lie near their parents, so that some positions fold and some do not
    h = torch.randn(gates, rows, block, 16, generator=g)
    safe = parents.clamp(min=0)
    h = torch.where((parents >= 0)[None, :, None, None], h[:, safe] + 0.3 * torch.randn(h.shape, generator=g), h)
    masks = torch.rand(gates, rows, block, generator=g) < 0.5 if forced else None
    capacity = tuple(max(1, int(share * rows * block) - k) for k in range(gates))
    (ref_steps, ref_masks, ref_overflow), (steps, masks_k, overflow) = _gate_both(
        parents, pad_rows, block, h, tau, capacity, masks)
    for (ref_rows, ref_slot), (k_rows, k_slot), a, b in zip(ref_steps, steps, ref_masks, masks_k):
        assert torch.equal(a, b)
        assert not a[0].any() and a[pad_rows].all()  # a main row never folds, padding always does
        assert torch.equal(ref_rows, k_rows) and torch.equal(ref_slot, k_slot)
    assert ref_overflow == overflow


class _TensorOps(TorchDispatchMode):
    """The tensor ops a gate issues outside its resolve launch (views and allocations are no launches)."""

    FREE = ("view", "slice", "select", "alias", "expand", "unsqueeze", "detach", "empty")

    def __init__(self):
        super().__init__()
        self.ops, self.paused = [], False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if not self.paused and not any(word in name for word in self.FREE):
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


@needs_triton
@pytest.mark.parametrize("forced", [True, False])
def test_kernel_gate_is_one_launch(forced, monkeypatch):
    """With the kernel a forced gate issues nothing but its resolve launch (the padding's folds, the
    capacity's clamp and the overflow flag inside it), a gated one only its flags' ops besides (the rows of
    no valid parent cleared by the launch too); making the gates of a forward issues only its overflow
    flag for forced masks, and the safe parents' ops besides for gated ones (no fold chains: the kernel
    needs none)."""
    parents, pad_rows = _batch([3, 2], 2, seed=3)
    h = torch.randn(len(parents), 4, 8)
    masks = torch.rand(1, len(parents), 4) < 0.5 if forced else None
    mode, resolve = _TensorOps(), ops.resolve_folds_packed

    def launch(*args):
        mode.paused = True  # the interpreter's own copies are not the gate's
        try:
            return resolve(*args)
        finally:
            mode.paused = False
    monkeypatch.setattr(ops, "resolve_folds_packed", launch)
    made, parent_ops, tau = _TensorOps(), _TensorOps(), torch.tensor(0.3)
    with made:
        gates = CapacityGates(parents, 4, 2, tau, (9,), pad_rows, masks, True)
    with parent_ops:
        safe_parents(parents)
    overflow_flag = ["aten.zeros.default"]  # the forward's one overflow flag
    assert gates.chains is None and sorted(made.ops) == sorted(overflow_flag + ([] if forced else parent_ops.ops))
    flag_ops, parent = _TensorOps(), safe_parents(parents)
    with flag_ops:
        fold_test(h, parent, gates.tau)
    with mode:
        gates(h)
    assert mode.ops == ([] if forced else flag_ops.ops) and (forced or mode.ops)


def test_check_gate_kernel():
    cpu = torch.device("cpu")
    assert check_gate_kernel(False, cpu) is False
    assert check_gate_kernel(None, cpu) == (kernels.triton_available() and kernels.interpreting())
    with pytest.raises(ValueError, match="^gate_kernel: expected None, True or False"):
        check_gate_kernel("yes", cpu)
    if not kernels.interpreting():
        with pytest.raises(ValueError, match="^gate_kernel: True needs Triton"):
            check_gate_kernel(True, cpu)
    with pytest.raises(ValueError, match="^gate_kernel: expected None, True or False, got 1$"):
        BatchGraphs(tiny_model(TINY_FAMILIES[0]), 2, 32, "eager", gate_kernel=1)


@needs_triton
def test_kernel_only_where_the_tile_fits_registers():
    from specfold_compile.kernels.gate import REGISTER_TILE_MAX

    assert KERNEL_TILE_MAX <= REGISTER_TILE_MAX  # never the kernel's rounds through global memory
    tau, block = torch.tensor(0.5), 32
    for rows, kernel in ((KERNEL_TILE_MAX // block, True), (KERNEL_TILE_MAX // block + 1, False)):
        parents = torch.tensor([-1] + [0] * (rows - 1))
        gates = CapacityGates(parents, block, 1, tau, (rows * block,), torch.zeros(rows, dtype=torch.bool), None, True)
        assert gates.resolve_kernel is kernel


def _serve(graphs, tau: float):
    """Three requests on two slots through an engine replaying ``graphs`` eagerly: tokens, fold masks, stats."""
    engine = Engine(graphs.model, 2, 64, mode="specfold", tau=tau, cuda_graphs=graphs)
    gen = torch.Generator().manual_seed(5)
    ids = [engine.add_request(torch.randint(0, 90, (n,), generator=gen),
                              RequestParams(max_new_tokens=m, stop_at_eos=False, threshold=0.2, draft_budget=3))
           for n, m in ((5, 3), (19, 2), (12, 5))]
    while engine.has_work:
        engine.step()
    outs = [engine.output(i) for i in ids]
    return [o.result.tokens for o in outs], [o.fold_masks for o in outs], engine.stats


@needs_triton
def test_engine_decodes_alike_with_either_gates():
    """The engine replaying SpecFold's forwards (eagerly, the CPU's path) with the kernel's gates and with
    the tensor ops' decodes the same tokens with the same fold masks, some positions folded."""
    model = tiny_model(TINY_FAMILIES[0])
    runs = []
    for gate_kernel in (None, False):
        graphs = BatchGraphs(model, 2, 64, "eager", min_packed=0, capacity_spread=0, gate_kernel=gate_kernel)
        assert graphs.gate_kernel is (gate_kernel is None)
        runs.append(_serve(graphs, 0.3))
    (tokens, masks, stats), (ref_tokens, ref_masks, ref_stats) = runs
    assert tokens == ref_tokens and stats == ref_stats
    assert 0 < stats.folded_draft_positions < stats.gated_draft_positions
    assert [len(m) for m in masks] == [len(m) for m in ref_masks]
    assert all(torch.equal(a, b) for got, want in zip(masks, ref_masks) for a, b in zip(got, want))
