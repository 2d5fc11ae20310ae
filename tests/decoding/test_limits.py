"""generate checks the prompt and max_new_tokens against the model's positions before any forward; the
decoding defaults live in one place (``decoding.DEFAULTS``)."""

import dataclasses
import inspect

import pytest
import torch

from decoding_fake_model import FakeModel
from specfold_compile.decoding import DEFAULTS, VerifyGraphs, generate, layout_prompt, record_traces
from specfold_compile.decoding.calibration import calibrate_cli
from specfold_compile.models import build


@pytest.mark.parametrize("preset", ["tiny-fast-dllm-v2", "tiny-nld"])
def test_the_last_block_that_fits_decodes_and_one_more_token_is_refused(preset):
    """max_position_embeddings 64, blocks of 16, a prompt of 5: Fast-dLLM v2's blocks sit on the grid
    (5 + 59 = 64 positions), NLD's start after the prompt (5 + 3 * 16 = 53: 48 tokens). The largest value
    decodes to the end (the model itself raises past its positions); one more is refused up front."""
    model = build(preset, max_position_embeddings=64)
    fit = 59 if preset == "tiny-fast-dllm-v2" else 48
    p = torch.arange(1, 6)
    assert len(generate(model, p, max_new_tokens=fit, stop_at_eos=False, threshold=0.3).tokens) == fit
    graphs = VerifyGraphs(model, replay="eager")
    for too_many in (fit + 1, 10**12):
        with pytest.raises(ValueError, match=rf"^max_new_tokens: {too_many} new tokens .*at most {fit} fit$"):
            generate(model, p, max_new_tokens=too_many, cuda_graphs=graphs)
    assert graphs.cache is None  # nothing allocated: the check runs before the prefill
    full = 64 if preset == "tiny-fast-dllm-v2" else 49  # the grid's next block, or the block after the prompt
    with pytest.raises(ValueError, match=f"^prompt_ids: {full} tokens leave no room"):
        generate(model, torch.arange(1, full + 1) % 100, max_new_tokens=1)
    if preset == "tiny-fast-dllm-v2":  # 60 tokens still leave 4 positions in their last block
        assert len(generate(model, torch.arange(1, 61) % 100, max_new_tokens=4, stop_at_eos=False).tokens) == 4


def test_nothing_runs_before_the_check():
    m = FakeModel(block_size=8, sub_block_size=4, grid=True, max_position_embeddings=40)
    with pytest.raises(ValueError, match="^max_new_tokens"):
        generate(m, torch.arange(1, 12), max_new_tokens=40)
    with pytest.raises(ValueError, match="^max_new_tokens"):
        record_traces(m, [torch.arange(1, 12)], max_new_tokens=40)
    assert m.nfe == 0
    assert len(generate(m, torch.arange(1, 12), max_new_tokens=29, stop_at_eos=False).tokens) == 29


def test_layout_positions():
    grid = layout_prompt(torch.arange(70), 32, True)
    assert (grid.first_block, grid.head, grid.block_causal) == (64, list(range(64, 70)), True)
    assert grid.blocks_end(26) == 96 and grid.blocks_end(27) == 128 and grid.last_block_start(27) == 96
    assert grid.max_new_tokens_within(128) == 58
    short = layout_prompt(torch.arange(5), 32, True)
    assert short.prefill_ids.numel() == 0 and short.first_block == 0 and short.blocks_end(27) == 32
    after = layout_prompt(torch.arange(70), 32, False)
    assert (after.first_block, after.head, after.block_causal) == (70, [], False)
    assert after.blocks_end(32) == 102 and after.blocks_end(33) == 134 and after.max_new_tokens_within(133) == 32


def test_one_set_of_defaults():
    """generate, record_traces and the calibration command line read DEFAULTS (frozen)."""
    assert (DEFAULTS.max_new_tokens, DEFAULTS.draft_budget, DEFAULTS.threshold, DEFAULTS.confidence_dtype) == \
        (128, 16, 0.9, "model")
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULTS.draft_budget = 8
    fields = {f.name for f in dataclasses.fields(DEFAULTS)}
    for fn in (generate, record_traces):
        params = inspect.signature(fn).parameters
        for name in fields & set(params):
            assert params[name].default == getattr(DEFAULTS, name), (fn.__name__, name)
    assert fields <= set(inspect.signature(generate).parameters)
    with pytest.raises(SystemExit):  # argparse's help: the defaults it prints are DEFAULTS'
        calibrate_cli(["--help"])
