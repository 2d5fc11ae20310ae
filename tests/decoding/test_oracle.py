"""Decoding against slow oracles written from the published algorithms (REFERENCES.md), on tiny random
models in float32.

The oracles use nothing of the decoder: each denoising step is one forward over the whole sequence
(``forward_sequence``, no cache) under the family's mask, and the commit rule is written out here. Fast-dLLM
v2: blocks on the absolute grid from the first prompt token, the block-causal mask everywhere, the
prompt's last ``L mod B`` tokens opening the first block, sub-blocks as 8-aligned windows of the absolute
block, position p read from the logits at p - 1, a block's position 0 the argmax at the position before
it (the prompt's, or the previous block's last). NLD: the prompt and every finished block causal, the
current block bidirectional over itself and everything before it, commits anywhere in the block at
``p >= threshold``, no shift.

The oracles decode every block to the end and cut the tokens after the first eos and after
``max_new_tokens``: the decoder stops early, which only skips forwards (an eos with nothing masked before
it, or a block's counted positions all committed, fixes everything that is output).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from specfold_compile.decoding import VerifyGraphs, generate
from specfold_compile.models import build

LENGTHS = range(1, 101)  # every value of L mod 32, prompts of exactly 32 and 64 tokens included
# SpecFold and the static cache on fewer prompts (their calls cost more here): every L mod 32 once (half
# of them at each threshold), whole prompts of one, two and three blocks, tails after two and three.
FEW_LENGTHS = [*range(1, 17), 32, *range(49, 66), 96, 100]
SEED = 0


def _threshold(length: int) -> float:
    """0.9 (mostly one commit a step on a random model) or 0.3 (several): each L mod 32 sees both."""
    return 0.9 if length <= 32 else 0.3


def _max_new(length: int, block: int) -> int:
    return block - length % block + 3  # the first block's generated positions, then into the next block


def _best(logits: torch.Tensor, mask_id: int) -> tuple[int, float]:
    """Greedy: the most probable non-mask token and its probability under the full softmax (float32)."""
    p = torch.softmax(logits.float(), dim=-1)
    best = int(torch.argmax(torch.cat((p[:mask_id], p.new_full((1,), -1.0), p[mask_id + 1:]))))  # lowest id on ties
    return best, float(p[best])


def _step_commits(candidates: list[tuple[int, int, float]], threshold: float, inclusive: bool) -> list:
    """candidates (position, token, confidence) -> those the rule commits: above the threshold (or at it,
    ``inclusive``), and always the most confident one (the lowest position on ties)."""
    passed = [c for c in candidates if (c[2] >= threshold if inclusive else c[2] > threshold)]
    return passed or [max(candidates, key=lambda c: (c[2], -c[0]))]


def _cut(generated: list[int], max_new: int, eos: int | None) -> list[int]:
    generated = generated[:max_new]
    if eos is not None and eos in generated:
        generated = generated[:generated.index(eos) + 1]
    return generated


def fast_dllm_oracle(model, prompt: list[int], max_new: int, threshold: float) -> list[int]:
    """Generated tokens, no eos rule (``_cut`` applies one)."""
    cfg = model.config
    B, S, M = cfg.block_size, cfg.sub_block_size, cfg.mask_token_id
    seq, L = list(prompt), len(prompt)

    def logits(seq):
        pos = torch.arange(len(seq))
        allowed = (pos[None, :] // B) <= (pos[:, None] // B)
        with torch.no_grad():
            return model.forward_sequence(torch.tensor(seq)[None], pos, allowed)[0]

    while len(seq) - L < max_new:
        if len(seq) % B == 0:  # a new block: position 0 from the position before it
            seq.append(_best(logits(seq)[-1], M)[0])
        start = len(seq) // B * B
        seq += [M] * (start + B - len(seq))
        while M in seq[start:]:
            lg = logits(seq)
            masked = [p for p in range(start, start + B) if seq[p] == M]
            window = (masked[0] - start) // S
            cands = [(p, *_best(lg[p - 1], M)) for p in masked if (p - start) // S == window]
            for p, tok, _ in _step_commits(cands, threshold, inclusive=False):
                seq[p] = tok
    return seq[L:]


def nld_oracle(model, prompt: list[int], max_new: int, threshold: float) -> list[int]:
    cfg = model.config
    B, M = cfg.block_size, cfg.mask_token_id
    seq, L = list(prompt), len(prompt)

    def logits(seq, block_start):
        pos = torch.arange(len(seq))
        allowed = (pos[None, :] <= pos[:, None]) | (pos[:, None] >= block_start)
        with torch.no_grad():
            return model.forward_sequence(torch.tensor(seq)[None], pos, allowed)[0]

    while len(seq) - L < max_new:
        start = len(seq)
        seq.append(_best(logits(seq, start)[-1], M)[0])
        seq += [M] * (B - 1)
        while M in seq[start:]:
            lg = logits(seq, start)
            cands = [(p, *_best(lg[p], M)) for p in range(start, start + B) if seq[p] == M]
            for p, tok, _ in _step_commits(cands, threshold, inclusive=True):
                seq[p] = tok
    return seq[L:]


def _prompt(length: int, vocab: int, mask_id: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + length)
    ids = torch.randint(0, vocab - 1, (length,), generator=g)
    return ids + (ids >= mask_id).long()  # never the mask token


@pytest.fixture(scope="module")
def fast():
    """A Fast-dLLM v2 model of the real block shape (32, sub-blocks of 8), random weights peaked enough
    that 0.3 commits several tokens a step, with the oracle's tokens for every prompt length; its eos is
    the token the oracle generates most often, so that eos really ends generations."""
    kw = dict(block_size=32, sub_block_size=8, initializer_range=1.0, seed=SEED)
    probe = build("tiny-fast-dllm-v2", **kw)
    cfg = probe.config
    want = {}
    for n in LENGTHS:
        ids = _prompt(n, cfg.vocab_size, cfg.mask_token_id)
        want[n] = fast_dllm_oracle(probe, ids.tolist(), _max_new(n, 32), _threshold(n))
    eos = Counter(t for toks in want.values() for t in toks).most_common(1)[0][0]
    model = build("tiny-fast-dllm-v2", eos_token_id=eos, **kw)
    return model, want


def _check(model, want, lengths, stop, **kw):
    cfg = model.config
    stopped = 0
    for n in lengths:
        ids = _prompt(n, cfg.vocab_size, cfg.mask_token_id)
        eos = cfg.eos_token_id if stop else None
        expected = _cut(want[n], _max_new(n, cfg.block_size), eos)
        got = generate(model, ids, max_new_tokens=_max_new(n, cfg.block_size), threshold=_threshold(n),
                       stop_at_eos=stop, **kw)
        assert got.tokens == expected, (n, kw)
        stopped += len(expected) < _max_new(n, cfg.block_size)
    return stopped


@pytest.mark.parametrize("stop", [False, True])
def test_vanilla_and_spiffy_equal_the_fast_dllm_oracle(fast, stop):
    model, want = fast
    stopped = _check(model, want, LENGTHS, stop)
    assert (stopped >= 10) == stop, stopped  # with the eos rule, eos really ends generations
    _check(model, want, LENGTHS, stop, mode="spiffy", draft_budget=8)


@pytest.fixture(scope="module")
def specfold_target(fast):
    model, _ = fast
    torch._dynamo.reset()
    yield torch.compile(model, backend="specfold", options={"tau": 0.0, "kernels": "torch"})
    torch._dynamo.reset()


@pytest.mark.parametrize("stop", [False, True])
def test_specfold_tau0_equals_the_fast_dllm_oracle(fast, specfold_target, stop):
    """A SpecFold-compiled model through the same generate: every multi-branch call folded (tau = 0
    recomputes every row), the oracle's tokens."""
    from specfold_compile.backend import collect_stats

    model, want = fast
    with collect_stats() as stats:
        _check(specfold_target, want, FEW_LENGTHS, stop, mode="spiffy", draft_budget=8)
    assert stats.calls > 0 and stats.folded_rows == 0


def test_static_cache_equals_the_fast_dllm_oracle(fast):
    """VerifyGraphs' static cache (replay="eager" on the CPU: the bookkeeping of CUDA-graph replays), an
    empty cache for prompts shorter than a block included."""
    model, want = fast
    graphs = VerifyGraphs(model, replay="eager")
    _check(model, want, FEW_LENGTHS, True, mode="spiffy", draft_budget=8, cuda_graphs=graphs)
    _check(model, want, FEW_LENGTHS[::4], False, cuda_graphs=graphs, all_logits=True)


def test_compiled_writes_equal_the_fast_dllm_oracle(fast):
    """compile_writes=True: the compiled block-causal prefill and block writes (aot_eager here: Dynamo and
    AOT autograd as under Inductor, without its C++ compile), on the dynamic and the static cache."""
    model, want = fast
    torch._dynamo.reset()
    model.__dict__["_compiled_methods"] = {
        name: torch.compile(getattr(model, name), backend="aot_eager")
        for name in ("prefill_block_causal", "append_block", "append_block_static")}
    try:
        lengths = [5, 32, 40, 64, 70]
        _check(model, want, lengths, True, mode="spiffy", draft_budget=8, compile_writes=True)
        _check(model, want, lengths, False, compile_writes=True, cuda_graphs=VerifyGraphs(model, replay="eager"))
    finally:
        model.__dict__.pop("_compiled_methods", None)
        torch._dynamo.reset()


def test_traces_follow_the_grid(fast):
    """record_traces (what calibration reads) decodes the same blocks: the first block's states hold the
    prompt's tail at its first positions, and its final state is the oracle's."""
    from specfold_compile.decoding import record_traces

    model, want = fast
    cfg = model.config
    for n in (5, 32, 45):
        ids = _prompt(n, cfg.vocab_size, cfg.mask_token_id)
        tr = record_traces(model, [ids], max_new_tokens=_max_new(n, 32), threshold=_threshold(n), stop_at_eos=False)
        first = tr["blocks"][0]
        tail = ids[n // 32 * 32:].tolist()
        assert all(s[:len(tail)] == tail for s in first["states"])
        assert first["states"][-1][len(tail):] == want[n][:32 - len(tail)]
        assert tr["confidence_dtype"] == "model"


@pytest.mark.parametrize("mode", ["vanilla", "spiffy"])
def test_nld_equals_its_oracle(mode):
    """NLD keeps its own layout: causal prefill of the whole prompt, a seeded block right after it."""
    model = build("tiny-nld", initializer_range=1.0, seed=SEED)
    cfg = model.config
    for n in (1, 7, 16, 23, 33):
        ids = _prompt(n, cfg.vocab_size, cfg.mask_token_id)
        max_new = cfg.block_size + 3
        want = nld_oracle(model, ids.tolist(), max_new, _threshold(n))
        got = generate(model, ids, mode=mode, max_new_tokens=max_new, threshold=_threshold(n), stop_at_eos=False)
        assert got.tokens == want[:max_new], n
