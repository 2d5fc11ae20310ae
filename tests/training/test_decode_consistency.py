"""The training layout sees exactly what the package's cache-based decoder sees."""

import pytest
import torch

from specfold_compile.training.decode import vanilla_decode
from specfold_compile.training.layout import Layout, fill_response, make_batch

models = pytest.importorskip("specfold_compile.models")

MASK, EOS, BOS, PAD = 0, 1, 2, 3
# RoPE tables are float32 and left padding shifts absolute positions: rounding-level differences only
TOL = dict(atol=1e-5, rtol=1e-4)


def _model():
    return models.build("tiny-fast-dllm-v2", num_layers=2, hidden_size=48, num_heads=4, num_kv_heads=2, head_dim=16,
                        intermediate_size=96, vocab_size=64, block_size=32, sub_block_size=8, mask_token_id=MASK,
                        eos_token_id=EOS, bos_token_id=BOS, pad_token_id=PAD, max_position_embeddings=1024,
                        dtype=torch.float64, seed=0, initializer_range=0.2)


def test_training_layout_equals_cached_decoding():
    model = _model()
    g = torch.Generator().manual_seed(0)
    prompt = [BOS] + torch.randint(5, 64, (8,), generator=g).tolist()
    resp = fill_response(torch.randint(5, 64, (40,), generator=g).tolist(), EOS)  # 2 blocks
    lay = Layout(prompt_len=12, resp_len=96, block=32)
    rows = torch.tensor([lay.row(prompt, resp, PAD)])
    inp, tgt, attn = make_batch(rows, torch.tensor([len(prompt)]), torch.tensor([2]), lay, MASK,
                                torch.Generator().manual_seed(3))
    logits = model.forward_sequence(inp, lay.positions(), attn)[0]
    P, R = lay.P, lay.R

    cache = model.prefill(torch.tensor(prompt))
    # seed of block 0 = logits at the last prompt position
    torch.testing.assert_close(cache.next_logits, logits[P - 1], **TOL)
    for k in range(2):
        for start in (P + R, P + 2 * R):  # both noisy copies
            noisy = inp[0, start + 32 * k:start + 32 * (k + 1)]
            dec = model(noisy[None], torch.tensor([-1]), cache)[0]  # shifted by the model
            train_shifted = logits[start + 32 * k - 1 + 1:start + 32 * (k + 1) - 1]  # rows u-1 for u = 1..31
            torch.testing.assert_close(dec[1:], train_shifted, **TOL)
        cache = model.write_block(cache, torch.tensor(resp[32 * k:32 * (k + 1)]))
        # seed of block k+1 = logits at the last position of the written block
        torch.testing.assert_close(cache.next_logits, logits[P + 32 * k + 31], **TOL)


@pytest.mark.parametrize("seed", [1, 4])
def test_batched_decoder_matches_the_package_decoder(seed):
    """The training self-check decoder (no cache, batched) decodes the tokens of decoding.generate:
    same commit rule (decoding.commit), same logits (up to rounding) through the training layout."""
    from specfold_compile.decoding import generate

    model = _model()
    g = torch.Generator().manual_seed(seed)
    prompts = [[BOS] + torch.randint(5, 64, (n,), generator=g).tolist() for n in (3, 9, 6)]
    outs, nfes = vanilla_decode(model, prompts, mask_id=MASK, eos_id=EOS, pad_id=PAD, max_blocks=2, batch_size=2)
    for p, o, n in zip(prompts, outs, nfes):
        expected = generate(model, torch.tensor(p), mode="vanilla", max_new_tokens=64).tokens
        assert (o[:o.index(EOS) + 1] if EOS in o else o) == expected
        assert len(o) % 32 == 0 and n >= 1 + len(o) // 32 * 2
