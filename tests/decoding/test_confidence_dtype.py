"""``confidence_dtype``: the threshold comparison in the model's dtype, as each reference makes it.

Constructed bf16 logits whose top probability sits between the two rules: Fast-dLLM v2's reference
commits where ``torch.softmax(bf16 logits) > 0.9`` (compared in bf16: ``> 0.8984375``, i.e. an fp32
probability above about 0.90039), NLD's keeps positions where that probability is not ``< 0.9`` (``>=
0.8984375`` in bf16, an fp32 probability of at least about 0.89648).
"""

from types import SimpleNamespace

import pytest
import torch

from specfold_compile.decoding import CONFIDENCE_DTYPES, DEFAULTS, commit, confidence, generate
from specfold_compile.models.config import FAMILY_DECODING_RULES

M = 7  # mask id of the constructed rows (vocabulary 8)
FAST = torch.tensor([2.890625, 0.0, 0.0], dtype=torch.bfloat16)  # fp32 top probability 0.900023
NLD = torch.tensor([2.171875, 0.0], dtype=torch.bfloat16)         # fp32 top probability 0.897695


def _row(top: torch.Tensor) -> torch.Tensor:
    """[8] bf16 logits: ``top`` at tokens 0.., the mask token (7) and the rest out of the softmax."""
    row = torch.full((8,), float("-inf"), dtype=torch.bfloat16)
    row[:top.numel()] = top
    return row


def test_constructed_probabilities_sit_between_the_rules():
    fast = torch.softmax(_row(FAST).float(), -1)[0].item()
    nld = torch.softmax(_row(NLD).float(), -1)[0].item()
    assert 0.9 < fast < 0.900390625 and 0.896484375 <= nld < 0.9
    assert torch.softmax(_row(FAST), -1)[0].item() == torch.softmax(_row(NLD), -1)[0].item() == 0.8984375


@pytest.mark.parametrize("family", ["fast-dllm-v2", "nld"])
def test_the_two_settings_commit_as_each_reference_would(family):
    """Two masked positions with the constructed distribution: "model" commits what the family's reference
    expression commits, "float32" the opposite (beyond the one most confident position always taken)."""
    rules = FAMILY_DECODING_RULES[family]
    logits = torch.stack([_row(FAST if family == "fast-dllm-v2" else NLD)] * 4)
    state = torch.tensor([3, M, M, 4])
    p_ref = torch.softmax(logits, dim=-1).max(dim=-1).values  # the reference: softmax in bf16, a Python float
    if family == "fast-dllm-v2":
        ref_passes = p_ref > 0.9
    else:
        ref_passes = ~(p_ref < 0.9)
    ref_commits = 1 if not bool(ref_passes[1:3].any()) else int(ref_passes[1:3].sum())
    commits = {}
    for dtype in CONFIDENCE_DTYPES:
        conf, tok = confidence(logits, M, dtype, rules.argmax_of_probs)
        assert conf.dtype == (torch.bfloat16 if dtype == "model" else torch.float32)
        out = commit(state, conf, tok, M, 4 if family == "fast-dllm-v2" else None, 0.9, rules.threshold_inclusive)
        commits[dtype] = int((out != state).sum())
        assert out.tolist()[1] == 0  # the most confident position is always committed (the lower one on ties)
    assert commits["model"] == ref_commits
    assert commits == ({"model": 1, "float32": 2} if family == "fast-dllm-v2" else {"model": 2, "float32": 1})


def test_fast_dllm_argmax_of_the_rounded_probabilities():
    """Two tokens whose bf16 logits differ but whose bf16 probabilities tie: Fast-dLLM v2's reference takes
    the argmax of the probabilities (the lower id), NLD's of the logits."""
    logits = torch.tensor([0.5078125, 0.51171875, 0.0, 0.0], dtype=torch.bfloat16)
    probs = torch.softmax(logits, -1)
    assert probs[0] == probs[1] and torch.softmax(logits.float(), -1)[0] < torch.softmax(logits.float(), -1)[1]
    assert int(confidence(logits, None, "model", argmax_of_probs=True)[1]) == int(torch.argmax(probs)) == 0
    assert int(confidence(logits, None, "model", argmax_of_probs=False)[1]) == 1
    assert int(confidence(logits, None, "float32")[1]) == 1
    # the mask token never wins, and its probability stays in the denominator
    conf, tok = confidence(logits, 0, "model", argmax_of_probs=True)
    assert int(tok) == 1 and conf.item() == probs[1].item()


def test_inclusive_rule_in_float32_too():
    """NLD's ``>=`` is its rule in any dtype: a float32 confidence of exactly fp32(0.9) commits there."""
    state = torch.tensor([3, M, M, M])
    conf = torch.tensor([0.0, 0.95, 0.9, 0.5])
    tok = torch.tensor([0, 1, 2, 3])
    assert commit(state, conf, tok, M, None, 0.9, inclusive=True).tolist() == [3, 1, 2, M]
    assert commit(state, conf, tok, M, None, 0.9).tolist() == [3, 1, M, M]


class _Constant:
    """A model whose every position gets the same constructed bf16 distribution (token 0 on top)."""

    def __init__(self, family):
        rules = FAMILY_DECODING_RULES[family]
        self.config = SimpleNamespace(block_size=8, sub_block_size=4 if rules.prompt_on_block_grid else None,
                                      mask_token_id=M, eos_token_id=6, vocab_size=8, max_position_embeddings=64,
                                      decoding_rules=rules)
        self.row = _row(FAST if family == "fast-dllm-v2" else NLD)

    def prefill(self, prompt_ids, block_causal=False):
        return SimpleNamespace(next_logits=self.row.clone(), length=prompt_ids.numel())

    def write_block(self, cache, block):
        return SimpleNamespace(next_logits=self.row.clone(), length=cache.length + block.numel())

    def __call__(self, tokens, parents, cache, logit_positions=None):
        out = self.row.expand(*tokens.shape, 8).clone()
        return out if logit_positions is None else out.flatten(0, 1)[logit_positions]


@pytest.mark.parametrize("family", ["fast-dllm-v2", "nld"])
def test_generate_honours_confidence_dtype(family):
    """Through generate: one commit a step under one setting, every window position at once under the
    other (Fast-dLLM v2: "model" one at a time; NLD: "float32"), the same tokens either way; Spiffy too."""
    model = _Constant(family)
    p = torch.tensor([1, 2, 3])
    steps = {d: generate(model, p, max_new_tokens=5, stop_at_eos=False, confidence_dtype=d).num_calls
             for d in CONFIDENCE_DTYPES}
    one_at_a_time = "model" if family == "fast-dllm-v2" else "float32"
    masked = 5 if family == "fast-dllm-v2" else 4  # NLD's block opens with the seed, a generated token
    assert steps[one_at_a_time] == masked and steps[next(d for d in steps if d != one_at_a_time)] < masked
    for d in CONFIDENCE_DTYPES:
        v = generate(model, p, max_new_tokens=5, stop_at_eos=False, confidence_dtype=d)
        s = generate(model, p, mode="spiffy", max_new_tokens=5, stop_at_eos=False, confidence_dtype=d)
        assert v.tokens == s.tokens == [0] * 5
    assert DEFAULTS.confidence_dtype == "model"
    for bad in ("bf16", None, 1):
        with pytest.raises(ValueError, match="^confidence_dtype"):
            generate(model, p, confidence_dtype=bad)
