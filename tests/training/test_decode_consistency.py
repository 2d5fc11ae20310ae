"""The training layout sees exactly what a cached decoder on the absolute block grid sees, and the
training self-check decoder (no cache, batched, left-padded) decodes the tokens of that cached decoder.

The cached decoder here is written in the test from the model's cache API (Fast-dLLM v2 prompt handling):
the prompt's whole 32-token blocks written one by one to an empty cache (the block-causal prefill), the
prompt's tail opening the first decoded block, the seed from the cache's last logit only when the prompt
fills whole blocks, each finished block written and its last logit seeding the next."""

import pytest
import torch

from specfold_compile import models
from specfold_compile.decoding.commit import block_finished, commit, confidence
from specfold_compile.training.decode import vanilla_decode
from specfold_compile.training.layout import Layout, fill_response, grid_blocks, make_batch

MASK, EOS, BOS, PAD = 0, 1, 2, 3
B, SB = 32, 8
# the cached path's attention runs in float32 (kernels.attention_ref): rounding-level differences only
TOL = dict(atol=1e-5, rtol=1e-4)


def _model():
    return models.build("tiny-fast-dllm-v2", num_layers=2, hidden_size=48, num_heads=4, num_kv_heads=2, head_dim=16,
                        intermediate_size=96, vocab_size=64, block_size=B, sub_block_size=SB, mask_token_id=MASK,
                        eos_token_id=EOS, bos_token_id=BOS, pad_token_id=PAD, max_position_embeddings=1024,
                        dtype=torch.float64, seed=0, initializer_range=0.2)


def _prompt_cache(model, prompt):
    """Empty cache + the prompt's whole blocks, each written attending to the ones before and to itself."""
    cache = model.empty_cache()
    n_whole = len(prompt) // B * B
    for s in range(0, n_whole, B):
        cache = model.write_block(cache, torch.tensor(prompt[s:s + B]))
    return cache, n_whole


@pytest.mark.parametrize("L,R", [(9, 40), (20, 5), (31, 30), (32, 40), (33, 3), (50, 20), (64, 31)])
def test_training_layout_equals_cached_decoding(L, R):
    model = _model()
    g = torch.Generator().manual_seed(L)
    prompt = [BOS] + torch.randint(5, 64, (L - 1,), generator=g).tolist()
    resp = fill_response(torch.randint(5, 64, (R,), generator=g).tolist(), L, EOS)
    n_prompt, n_dec = grid_blocks(L, R)
    lay = Layout(n_prompt, n_dec)
    full = prompt + resp
    inp, tgt, attn = make_batch(torch.tensor([lay.row(prompt, resp)]), torch.tensor([L]), lay, MASK,
                                torch.Generator().manual_seed(3))
    logits = model.forward_sequence(inp, lay.positions(), attn)[0]
    C, D = lay.C, lay.D
    cache, first = _prompt_cache(model, prompt)
    if first:  # the prefill's last logit: the first block's seed when L % 32 == 0
        torch.testing.assert_close(cache.next_logits, logits[first - 1], **TOL)
    for k in range(n_dec):
        for start in (C, C + D):  # both noisy copies, block k
            noisy = inp[0, start + B * k:start + B * (k + 1)]
            dec = model(noisy[None], torch.tensor([-1]), cache)[0]  # shifted: dec[p] = raw[p - 1], dec[0] = raw[B - 1]
            raw = logits[start + B * k:start + B * (k + 1)]
            torch.testing.assert_close(dec[1:], raw[:-1], **TOL)
            torch.testing.assert_close(dec[0], raw[-1], **TOL)
        if k + 1 < n_dec:
            cache = model.write_block(cache, torch.tensor(full[first + B * k:first + B * (k + 1)]))
            # the block write's last logit seeds block k + 1: the clean stream's last index of block k
            torch.testing.assert_close(cache.next_logits, logits[first + B * (k + 1) - 1], **TOL)


def _cached_decode(model, prompt, eos, max_blocks, threshold=0.9):
    """(generated ids, NFE) of the cached decoder on the absolute grid."""
    cache, first = _prompt_cache(model, prompt)
    nfe = 1 if first else 0
    fixed = len(prompt) - first
    if fixed:
        X = torch.tensor(prompt[first:] + [MASK] * (B - fixed))
    else:
        X = torch.tensor([int(confidence(cache.next_logits, MASK)[1])] + [MASK] * (B - 1))
    out = []
    for n_blocks in range(1, max_blocks + 1):
        while not block_finished(X[fixed:], MASK, B - fixed, eos):
            conf, tok = confidence(model(X[None], torch.tensor([-1]), cache)[0], MASK)
            X = commit(X, conf, tok, MASK, SB, threshold)
            nfe += 1
        gen = X[fixed:].tolist()
        out += gen
        if eos in gen or n_blocks == max_blocks:
            break
        cache = model.write_block(cache, X)
        nfe += 1
        X = torch.tensor([int(confidence(cache.next_logits, MASK)[1])] + [MASK] * (B - 1))
        fixed = 0
    return out, nfe


def test_batched_decoder_matches_the_cached_decoder():
    """Every value class of L mod 32 (0 with one and two whole blocks, 1, 31, others), prompts shorter than a
    block, rows of different prefix lengths in one batch; without and with an eos that occurs mid-block."""
    model = _model()
    g = torch.Generator().manual_seed(7)
    lengths = (1, 7, 31, 32, 33, 50, 64, 65)
    prompts = [[BOS] + torch.randint(5, 64, (n - 1,), generator=g).tolist() for n in lengths]
    never = 10 ** 6  # no eos: every row decodes max_blocks blocks
    outs, nfes = vanilla_decode(model, prompts, mask_id=MASK, eos_id=never, pad_id=PAD, max_blocks=2, batch_size=5)
    for p, o, n in zip(prompts, outs, nfes):
        assert (o, n) == _cached_decode(model, p, never, 2)
        assert len(o) == 2 * B - len(p) % B
    # an eos the model does produce: the token at the middle of the first generated block of prompt 0
    eos = outs[0][12]
    outs, nfes = vanilla_decode(model, prompts, mask_id=MASK, eos_id=eos, pad_id=PAD, max_blocks=2, batch_size=3)
    assert any(eos in o and len(o) < 2 * B - len(p) % B for p, o in zip(prompts, outs))
    for p, o, n in zip(prompts, outs, nfes):
        assert (o, n) == _cached_decode(model, p, eos, 2)
