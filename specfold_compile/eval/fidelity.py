"""Draft fidelity: how close the folded verification logits are to the dense ones at still-masked draft
positions, next to the zero-compute baseline that copies the parent branch's logits."""

from __future__ import annotations

import time

import torch


def fidelity_positions(folded: torch.Tensor, dense: torch.Tensor, tokens: torch.Tensor, parents, mask_id: int
                       ) -> dict[str, torch.Tensor]:
    """Per still-masked draft position (``tokens[n, i] == mask_id``, ``n >= 1``): whether argmax of the
    folded logits equals argmax of the dense ones, their relative error ``||folded - dense|| / ||dense||``,
    and the same two numbers for the copy baseline (the parent row's dense logits at that position).

    ``folded``/``dense``: ``[N, B, V]``; ``tokens``: ``[N, B]``; ``parents``: ``[N]`` (``parents[0] = -1``).
    Returns 1-D tensors ``fold_agree``, ``fold_relerr``, ``copy_agree``, ``copy_relerr`` (float32, one entry
    per position, rows in order).
    """
    tokens = torch.as_tensor(tokens).cpu()
    parents = torch.as_tensor(parents, dtype=torch.int64).cpu()
    folded = folded.detach().float().cpu()
    dense = dense.detach().float().cpu()
    if folded.shape != dense.shape or folded.shape[:2] != tokens.shape:
        raise ValueError(f"shapes: folded {tuple(folded.shape)}, dense {tuple(dense.shape)}, tokens {tuple(tokens.shape)}")
    sel = tokens == mask_id
    sel[0] = False
    n_idx, i_idx = sel.nonzero(as_tuple=True)
    d = dense[n_idx, i_idx]            # [P, V]
    f = folded[n_idx, i_idx]
    c = dense[parents[n_idx], i_idx]   # the parent's dense logits at the same position
    norm = d.norm(dim=-1)
    darg = d.argmax(-1)
    return {
        "fold_agree": (f.argmax(-1) == darg).float(),
        "fold_relerr": (f - d).norm(dim=-1) / norm,
        "copy_agree": (c.argmax(-1) == darg).float(),
        "copy_relerr": (c - d).norm(dim=-1) / norm,
    }


def summarize_fidelity(parts: dict[str, list[torch.Tensor]] | dict[str, torch.Tensor]) -> dict:
    """Aggregate ``fidelity_positions`` outputs: argmax agreement share and relative error median / p99."""
    cat = {k: (torch.cat(v) if isinstance(v, list) and v else (v if isinstance(v, torch.Tensor) else torch.empty(0)))
           for k, v in parts.items()}
    n = int(cat["fold_agree"].numel()) if "fold_agree" in cat else 0
    out: dict = {"positions": n}
    for which in ("fold", "copy"):
        agree, err = cat.get(f"{which}_agree"), cat.get(f"{which}_relerr")
        if n == 0:
            out.update({f"{which}_argmax_agree": float("nan"), f"{which}_relerr_median": float("nan"),
                        f"{which}_relerr_p99": float("nan")})
            continue
        err = err.double()
        out[f"{which}_argmax_agree"] = float(agree.double().mean())
        out[f"{which}_relerr_median"] = float(torch.quantile(err, 0.5))
        out[f"{which}_relerr_p99"] = float(torch.quantile(err, 0.99))
    return out


class FidelityRecorder:
    """A thin stand-in for the eager model in Spiffy decoding. ``__call__`` returns the dense logits (so
    decoding is unchanged and lossless) and, for every ``every``-th call with more than one branch,
    evaluates ``folded_verify`` at each ``tau`` and accumulates ``fidelity_positions``."""

    def __init__(self, model, taus, every: int = 1) -> None:
        self.model = model
        self.taus = [float(t) for t in taus]
        self.every = max(1, int(every))
        self.parts = {t: {k: [] for k in ("fold_agree", "fold_relerr", "copy_agree", "copy_relerr")}
                      for t in self.taus}
        self.multi_calls = 0
        self.measured_calls = 0
        self.seconds = 0.0

    @property
    def config(self):
        return self.model.config

    def prefill(self, *args, **kwargs):
        return self.model.prefill(*args, **kwargs)

    def write_block(self, *args, **kwargs):
        return self.model.write_block(*args, **kwargs)

    def __getattr__(self, name):  # anything else the decoder might read
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)

    def __call__(self, tokens, parents, cache, logit_positions=None):
        from ..reference import folded_verify  # noqa: PLC0415

        dense = self.model(tokens, parents, cache)
        if tokens.shape[0] > 1:
            self.multi_calls += 1
            if (self.multi_calls - 1) % self.every == 0:
                t0 = time.perf_counter()
                self.measured_calls += 1
                mask_id = int(self.model.config.mask_token_id)
                for tau in self.taus:
                    folded, _ = folded_verify(self.model, tokens, parents, cache, tau)
                    for k, v in fidelity_positions(folded, dense, tokens, parents, mask_id).items():
                        self.parts[tau][k].append(v)
                self.seconds += time.perf_counter() - t0
        return dense if logit_positions is None else dense.flatten(0, 1)[logit_positions]

    def summary(self) -> dict[float, dict]:
        return {t: summarize_fidelity(p) for t, p in self.parts.items()}
