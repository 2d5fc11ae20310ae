"""The analysis reads every op's dims from its arguments bound to its signature, and proves every value that
enters a packed region from outside position-wise back to the residual stream or the graph inputs.

Each case patches one op into the MLP region of a one-layer verifier (or feeds an outside value to it):
over the channel dim the graph folds and is exact at tau = 0; over the branch/position dims it falls
back to the unchanged graph (the dense result) with the reason recorded, and strict mode raises."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specfold_compile.testing import assert_close, capture_graph, root_cause
from specfold_compile import ops
from specfold_compile.backend import SpecFoldError, SpecFoldSettings, collect_stats
from specfold_compile.passes import find_regions


def _rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class MLPVerifier(nn.Module):
    """One decoder layer; ``mlp_op(y)`` transforms the MLP's normed input, ``extra(h)`` is a value computed
    from the layer input outside the MLP region and added to it."""

    def __init__(self, mlp_op=None, extra=None, channels: int = 16, heads: int = 2, head_dim: int = 8):
        super().__init__()
        torch.manual_seed(0)
        self.mlp_op, self.extra, self.heads, self.head_dim = mlp_op, extra, heads, head_dim
        self.emb = nn.Embedding(32, channels)
        self.qkv = nn.Linear(channels, 3 * heads * head_dim)
        self.o = nn.Linear(heads * head_dim, channels)
        self.up, self.down = nn.Linear(channels, 32), nn.Linear(32, channels)

    def forward(self, tokens, parents, k_pre, v_pre):
        h = ops.mark_branches(self.emb(tokens), parents)
        n, b, _ = h.shape
        q, k, v = self.qkv(_rms(h)).view(n, b, 3, self.heads, self.head_dim).unbind(2)
        h_mid = h + self.o(ops.branch_attention(q, k, v, k_pre, v_pre, self.head_dim ** -0.5).reshape(n, b, -1))
        y = _rms(h_mid)
        if self.mlp_op is not None:
            y = self.mlp_op(y)
        if self.extra is not None:
            y = y + self.extra(h)
        return h_mid + self.down(F.silu(self.up(y)))


def _inputs():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 32, (1, 8), generator=g).repeat(4, 1)
    for n in range(1, 4):
        tokens[n, n] = (tokens[n, n] + 7) % 32  # each draft differs from its parent in one position
    return tokens, torch.tensor([-1, 0, 1, 1]), torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)


def _shift_index(h):
    pos = torch.arange(h.shape[1], device=h.device)
    return h[:, (pos - 1).clamp(min=0)]


# name: op on the MLP input y [N, B, C]. Over the channel dim (-1): position-wise.
CHANNEL_OPS = {
    "linalg.vector_norm(y, 2, dim=-1)": lambda y: y * torch.linalg.vector_norm(y, 2, dim=-1, keepdim=True),
    "Tensor.norm(2, -1, True)": lambda y: y / y.norm(2, -1, True),
    "torch.norm(y, 2, -1, True)": lambda y: y / torch.norm(y, 2, -1, True),
    "norm without keepdim": lambda y: y * y.norm(2, -1).unsqueeze(-1),
    "mean(-1, keepdim=True)": lambda y: y - y.mean(-1, keepdim=True),
    "sum(dim=[-1])": lambda y: y * y.sum(dim=[-1]).unsqueeze(-1),
    "amax(y, -1, True)": lambda y: y / torch.amax(y, -1, True).abs().clamp(min=1e-3),
    "Tensor.softmax(-1)": lambda y: y.softmax(-1),
    "F.softmax(dim=-1)": lambda y: F.softmax(y, dim=-1),
    "cumsum(-1)": lambda y: y.cumsum(-1),
    "flip(-1)": lambda y: y.flip(-1),
    "roll(y, 1, -1)": lambda y: torch.roll(y, 1, -1),
    "std(-1, correction=0)": lambda y: y / (torch.std(y, -1, correction=0, keepdim=True) + 1),
    "var(-1, correction=0)": lambda y: y * y.var(-1, keepdim=True, correction=0),
}
# The same ops over the branch (0) or position (1) dims, or over every dim: they mix rows.
MIXING_OPS = {
    "linalg.vector_norm(y, 2, dim=1)": lambda y: y * torch.linalg.vector_norm(y, 2, dim=1, keepdim=True),
    "Tensor.norm(2, 1, True)": lambda y: y / y.norm(2, 1, True),
    "torch.norm(y, 2, 1, True)": lambda y: y / torch.norm(y, 2, 1, True),
    "norm over all dims": lambda y: y / y.norm(),
    "mean(0, keepdim=True)": lambda y: y - y.mean(0, keepdim=True),
    "sum(1, keepdim=True)": lambda y: y * y.sum(1, keepdim=True),
    "sum(dim=[])": lambda y: y * torch.sum(y, dim=[], keepdim=True),
    "amax(y, 1, True)": lambda y: y / torch.amax(y, 1, True).abs().clamp(min=1e-3),
    "Tensor.softmax(1)": lambda y: y.softmax(1),
    "F.softmax(dim=0)": lambda y: F.softmax(y, dim=0),
    "cumsum(1)": lambda y: y.cumsum(1),
    "flip(1)": lambda y: y.flip(1),
    "roll(y, 1, 1)": lambda y: torch.roll(y, 1, 1),
    "roll without dims": lambda y: torch.roll(y, 1),
    "std(1, correction=0)": lambda y: y / (torch.std(y, 1, correction=0, keepdim=True) + 1),
    "var(correction=0) over all dims": lambda y: y * y.var(correction=0),
}
# name: value computed from the layer input h outside the MLP region, added to the MLP's input.
POSITION_WISE_EXTRA = {
    "h * 0.5": lambda h: h * 0.5,
    "rms(h)": _rms,
}
MIXING_EXTRA = {
    "token shift cat((h[:, :1], h[:, :-1]), 1)": lambda h: torch.cat((h[:, :1], h[:, :-1]), dim=1),
    "token shift h[:, p - 1]": _shift_index,
    "cumsum over positions": lambda h: h.cumsum(1),
    "roll over branches": lambda h: h.roll(1, 0),
    "mean over positions, broadcast": lambda h: h.mean(1, keepdim=True),
}


def _analysis(model):
    return find_regions(capture_graph(model, *_inputs())[0], SpecFoldSettings())


def _compile(model, **options):
    torch._dynamo.reset()
    return torch.compile(model, backend="specfold", options=options)


def _check_folds(model):
    analysis = _analysis(model)
    assert analysis.foldable, [str(b) for b in analysis.blockers]
    tokens, parents, k_pre, v_pre = _inputs()
    with collect_stats() as s:
        out = _compile(model, tau=0.5, strict=True)(tokens, parents, k_pre, v_pre)
    assert s.calls == 1 and s.folded_rows > 0
    # P2: the main row is computed at every position, through the packed region: an op that mixed the
    # packed rows [R, 1, C] would change it.
    assert_close(out[:1], model(tokens[:1], parents[:1], k_pre, v_pre), what="P2")


def _check_falls_back(model, kind):
    analysis = _analysis(model)
    assert not analysis.foldable
    assert analysis.blockers and all(b.kind == kind for b in analysis.blockers), [str(b) for b in analysis.blockers]
    args = _inputs()
    with warnings.catch_warnings(record=True) as record, collect_stats() as s:
        warnings.simplefilter("always")
        out = _compile(model, tau=0.5)(*args)
    messages = [str(w.message) for w in record if "specfold" in str(w.message)]
    assert len(messages) == 1 and all(str(b) in messages[0] for b in analysis.blockers), messages
    assert s.calls == 0  # nothing folded
    assert_close(out, model(*args), tol=1e-6, what="fallback = dense")
    with pytest.raises(Exception) as info:
        _compile(model, tau=0.5, strict=True)(*args)
    assert isinstance(root_cause(info.value), SpecFoldError), repr(info.value)


@pytest.mark.parametrize("name", sorted(CHANNEL_OPS))
def test_ops_over_the_channel_dim_fold(name):
    _check_folds(MLPVerifier(mlp_op=CHANNEL_OPS[name]))


@pytest.mark.parametrize("name", sorted(MIXING_OPS))
def test_ops_over_branch_or_position_dims_block(name):
    analysis = _analysis(MLPVerifier(mlp_op=MIXING_OPS[name]))
    assert not analysis.foldable
    assert {b.kind for b in analysis.blockers} == {"unsupported_op"}, [str(b) for b in analysis.blockers]
    assert "branch/position" in analysis.blockers[0].detail or "all dims" in analysis.blockers[0].detail


@pytest.mark.parametrize("name", ["linalg.vector_norm(y, 2, dim=1)", "Tensor.norm(2, 1, True)",
                                  "torch.norm(y, 2, 1, True)"])
def test_norms_over_positions_fall_back_to_dense(name):
    """The order argument sits where other reductions put dim: each form must still block."""
    _check_falls_back(MLPVerifier(mlp_op=MIXING_OPS[name]), "unsupported_op")


@pytest.mark.parametrize("name", sorted(POSITION_WISE_EXTRA))
def test_position_wise_outside_values_fold(name):
    _check_folds(MLPVerifier(extra=POSITION_WISE_EXTRA[name]))


@pytest.mark.parametrize("name", sorted(MIXING_EXTRA))
def test_mixing_outside_values_fall_back_to_dense(name):
    model = MLPVerifier(extra=MIXING_EXTRA[name])
    _check_falls_back(model, "outside_value")
    assert "MLP region" in str(_analysis(model).blockers[0])
