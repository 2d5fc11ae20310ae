"""The shipped model is decoded with the layout it was trained with: the training self-check's decoder
(no cache, whole-sequence forwards under the training mask) gives exactly the tokens of the package's
cached ``generate(mode="vanilla")`` on test prompts of every task, through the loader's prompt encoding."""

import pytest
import torch

from specfold_compile import generate
from specfold_compile.loading import default_model_available, encode, load_model
from specfold_compile.tasks import sample
from specfold_compile.training.decode import vanilla_decode

pytestmark = pytest.mark.skipif(not default_model_available(), reason="no shipped model in this checkout")


@pytest.fixture(scope="module")
def shipped():
    return load_model(None)


@pytest.mark.parametrize("task", ["math", "code", "instruct"])
def test_training_decoder_equals_generate_on_the_shipped_model(shipped, task):
    cfg = shipped.config
    problems = sample(task, "test", 4, seed=0)
    prompts = [encode(shipped, p.prompt) for p in problems]
    blocks = 2
    outs, nfes = vanilla_decode(shipped, [p.tolist() for p in prompts], mask_id=cfg.mask_token_id,
                                eos_id=cfg.eos_token_id, pad_id=cfg.pad_token_id, max_blocks=blocks)
    for prompt, out, nfe in zip(prompts, outs, nfes):
        fixed = len(prompt) % cfg.block_size  # the prompt's tail shares the first block
        res = generate(shipped, prompt, mode="vanilla", max_new_tokens=blocks * cfg.block_size - fixed)
        want = out[:out.index(cfg.eos_token_id) + 1] if cfg.eos_token_id in out else out
        assert res.tokens[:len(want)] == want
        assert len(want) > 0 and nfe == res.nfe
