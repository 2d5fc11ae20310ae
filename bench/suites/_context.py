"""What every suite of ``bench.run`` shares: the run's device and kernels (``BenchContext``), the models
and inputs it measures, timing helpers, and the Tuning built from the command line."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from specfold_compile.backend.settings import Tuning
from specfold_compile.decoding import mark_dynamic_shapes
from specfold_compile.models import build

from ..common import draft_tokens, draft_tree, time_cuda_graph, time_launched

MODELS = ("fast-dllm-v2-1.5b", "fast-dllm-v2-7b", "nld-3b")
# Positions changed per draft (of 32) -> about that recompute ratio. Where computed rows outgrow the
# packed linears' cuBLAS head (dense_fraction) latency steps up; points on both sides of that step for
# dense_fraction 0.3 (0.28 / 0.34) and 0.45 (0.44 / 0.59) keep the end_to_end projection, which
# interpolates between points, from smearing it.
CHANGED_FOR_RATIO = {0.1: 2, 0.25: 6, 0.3: 9, 0.35: 11, 0.5: 14, 0.6: 19}
TAU = 0.3
# Branch counts of the per-check sweep, with 13: where the backend's cost model starts folding at the
# 1.5B shape (12) and the branch counts most of the task suite's Spiffy calls have (13-16).
PER_CHECK_NS = (1, 5, 9, 13, 17, 33)
# --cpu-dry-run's tiny shape for every preset (torch kernels, no CUDA graphs): checks the suites' logic
# before spending GPU time; its numbers mean nothing.
DRY_RUN_SHAPE = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                     vocab_size=512, mask_token_id=511, eos_token_id=1, bos_token_id=0, max_position_embeddings=8192)


@dataclass
class BenchContext:
    """The run's target: device, the backend's kernels, shape overrides per preset (the dry run), and
    the seconds spent compiling and warming up (first calls), reported apart from the measurements."""

    device: str = "cuda"
    kernels: str = "triton"
    shapes: dict[str, dict] = field(default_factory=dict)
    compile_s: float = 0.0

    @classmethod
    def dry_run(cls) -> "BenchContext":
        return cls("cpu", "torch", {name: DRY_RUN_SHAPE for name in MODELS})

    def model(self, args, name: str):
        """A random bf16 model of this preset (seed 0); q/k/v and gate/up fused (the default) unless
        --no-fuse-projections."""
        return build(name, device=self.device, dtype=torch.bfloat16, seed=0,
                     fuse_projections=getattr(args, "fuse_projections", True), **self.shapes.get(name, {}))

    def prefix(self, model, length: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, min(model.config.vocab_size, 30000), (length,), generator=gen).to(self.device)
        return model.prefill(ids)

    def inputs(self, model, n_rows: int, changed: int, seed: int, cache=None):
        """Tokens and parents of one verification call; with ``cache``, N and the prefix length are marked
        dynamic as the decode loop marks them, so compiled modes trace the graphs a real decode runs
        (one per size class) instead of recompiling per N and prefix."""
        cfg = model.config
        gen = torch.Generator().manual_seed(seed)
        vocab = min(cfg.vocab_size, 30000)
        main = torch.randint(0, vocab, (cfg.block_size,), generator=gen)
        parents = draft_tree(n_rows)
        tokens = draft_tokens(main, parents, changed, vocab, gen).to(self.device)
        parents = torch.tensor(parents, device=self.device)
        if cache is not None:
            mark_dynamic_shapes(tokens, parents, cache)
        return tokens, parents

    def logit_positions(self, n_rows: int, block: int, fraction: float | None, seed: int) -> torch.Tensor | None:
        """``fraction`` of the N x B flat positions (at least one), random and sorted, marked dynamic as the
        decode loop marks its masked positions; None (every position's logits) without a fraction."""
        if fraction is None:
            return None
        count = max(1, round(fraction * n_rows * block))
        gen = torch.Generator().manual_seed(seed)
        positions = torch.randperm(n_rows * block, generator=gen)[:count].sort().values.to(self.device)
        if count > 1:
            torch._dynamo.maybe_mark_dynamic(positions, 0)
        return positions

    def device_name(self) -> str:
        return torch.cuda.get_device_name() if self.device == "cuda" else "cpu"

    def first_call(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        """Run ``fn`` once (a compile, autotuning, a warm-up): its result and seconds, counted as
        compile time of the run."""
        t0 = time.monotonic()
        out = fn()
        seconds = time.monotonic() - t0
        self.compile_s += seconds
        return out, seconds

    def empty_cache(self) -> None:
        if self.device == "cuda":
            torch.cuda.empty_cache()


def timed(fn) -> dict:
    """A row's timings: ``ms``, the median of CUDA-graph replays (kernel time and the gaps between
    kernels; ``cuda_graph`` says whether capture worked), and ``launched_ms``, plain calls each waited
    for, as a decode loop without CUDA graphs runs them (host dispatch included)."""
    ms, captured = time_cuda_graph(fn)
    return {"ms": ms, "cuda_graph": captured, "launched_ms": time_launched(fn)}


def tuning(args, *names: str, **fixed: Any) -> Tuning:
    """The backend's Tuning with the command line's values of ``names`` (flags of the same names:
    dense_fraction, min_spill_us, fold_min_branches, fold_launched, combo_kernels), ``fixed`` values,
    and --one-pass-max-prefix wherever it is given (it sets the folded attention's launches)."""
    values = {name: getattr(args, name) for name in names}
    if getattr(args, "one_pass_max_prefix", None) is not None:
        values["one_pass_max_prefix"] = args.one_pass_max_prefix
    return Tuning(**{**values, **fixed})


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))
