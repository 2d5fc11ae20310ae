"""find_regions accepts dim ops that leave (branch, position) leading and blocks the ones that move them;
an accepted graph computes the same function with and without packing."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specfold_compile import ops
from specfold_compile.backend import SpecFoldSettings, collect_stats
from specfold_compile.passes import find_regions
from specfold_compile.testing import capture_graph

VARIANTS = {
    # name: (pre-attention transform of x [N, B, C], foldable)
    "trailing_transpose": (lambda x: x.unsqueeze(-1).transpose(-1, -2).squeeze(-2), True),
    "trailing_flatten": (lambda x: x.unflatten(-1, (4, -1)).flatten(2), True),
    "permute_trailing": (lambda x: x.unsqueeze(-1).permute(0, 1, 3, 2).squeeze(2), True),
    "branch_transpose": (lambda x: x.transpose(0, 1).transpose(0, 1), False),
    "flatten_rows": (lambda x: x.flatten(0, 1).view(x.shape), False),
    "leading_unsqueeze": (lambda x: x.unsqueeze(0).squeeze(0), False),
    "layer_norm": (lambda x: F.layer_norm(x, x.shape[-1:]), True),
    "layer_norm_over_positions": (lambda x: F.layer_norm(x, x.shape[-2:]), False),
    "chunk_trailing": (lambda x: torch.cat(x.chunk(2, dim=-1), dim=-1), True),
    "chunk_positions": (lambda x: torch.cat(x.chunk(2, dim=1), dim=1), False),
}


class DimOpVerifier(nn.Module):
    def __init__(self, transform, channels: int = 16, heads: int = 2, head_dim: int = 8):
        super().__init__()
        torch.manual_seed(0)
        self.transform, self.heads, self.head_dim = transform, heads, head_dim
        self.emb = nn.Embedding(32, channels)
        self.qkv = nn.Linear(channels, 3 * heads * head_dim)
        self.o = nn.Linear(heads * head_dim, channels)
        self.up, self.down = nn.Linear(channels, 32), nn.Linear(32, channels)

    def forward(self, tokens, parents, k_pre, v_pre):
        h = ops.mark_branches(self.emb(tokens), parents)
        n, b, _ = h.shape
        x = self.transform(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))
        q, k, v = self.qkv(x).view(n, b, 3, self.heads, self.head_dim).unbind(2)
        h = h + self.o(ops.branch_attention(q, k, v, k_pre, v_pre, self.head_dim ** -0.5).reshape(n, b, -1))
        return h + self.down(F.silu(self.up(h)))


def _inputs():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 32, (1, 8), generator=g).repeat(4, 1)
    for n in range(1, 4):
        tokens[n, n] = (tokens[n, n] + 7) % 32  # each draft differs from its parent in one position
    return tokens, torch.tensor([-1, 0, 1, 1]), torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)


def _analysis(model, args):
    return find_regions(capture_graph(model, *args)[0], SpecFoldSettings())


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_dim_ops_in_regions(name):
    transform, foldable = VARIANTS[name]
    model, args = DimOpVerifier(transform), _inputs()
    analysis = _analysis(model, args)
    if not foldable:
        assert not analysis.foldable
        assert any(b.kind == "unsupported_op" and ("branch/position" in b.detail or "splits" in b.detail)
                   for b in analysis.blockers), [str(b) for b in analysis.blockers]
        return
    assert analysis.foldable, [str(b) for b in analysis.blockers]
    outs = []
    for pack in (True, False):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="specfold", options={"tau": 0.5, "pack": pack, "strict": True})
        with collect_stats() as s:
            outs.append(compiled(*args))
        assert s.folded_rows > 0
    # Packing computes only the computed rows; without it every row is computed and origins are read:
    # the same function.
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
