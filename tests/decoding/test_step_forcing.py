"""``decoding.step_forcing``: a recorded device-loop decode forced on another decode (another threshold,
another model) makes exactly the recorded calls and tokens, and a SpecFold-compiled forward folds exactly
the recorded masks."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfold_compile import SpecFoldBackend
from specfold_compile.backend import fold_launched_calls
from specfold_compile.decoding.graph import default_draft_graph, load_draft_graph
from specfold_compile.decoding.device_loop import decode_on_device
from specfold_compile.decoding.device_step import STATUS_FIELDS
from specfold_compile.decoding.step_forcing import RecordedStep, StepForcing, StepRecorder
from specfold_compile.models import build
from specfold_compile.ops.fold_masks import forced_fold_masks, recorded_fold_masks

HSET = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])


def calls(result):
    return [(s.branches, s.accepted, list(s.parents)) for s in result.steps]


def decode(model, prompt, threshold, mode="spiffy", forward=None, trace=None, max_new=40, steps_per_read=1):
    graph = load_draft_graph(default_draft_graph(model.config.block_size), model.config.block_size)
    return decode_on_device(model, prompt, mode, max_new, threshold, 6 if mode != "vanilla" else 0,
                            graph if mode != "vanilla" else None, True, forward=forward, trace=trace,
                            compile_step=False, steps_per_read=steps_per_read)


class Logged:
    """The model's verification call, its inputs kept."""

    def __init__(self, model):
        self.model, self.inputs = model, []

    def __call__(self, rows, parents, cache, **kw):
        self.inputs.append((rows.clone(), parents.clone()))
        return self.model(rows, parents, cache, **kw)


@pytest.fixture(scope="module")
def models():
    return build("tiny-fast-dllm-v2", seed=0), build("tiny-fast-dllm-v2", seed=1)


@settings(max_examples=12, **HSET)
@given(p=st.lists(st.integers(2, 120), min_size=1, max_size=20), threshold=st.sampled_from([0.05, 0.3]),
       mode=st.sampled_from(["vanilla", "spiffy"]), steps_per_read=st.sampled_from([1, 3]))
def test_forced_decode_makes_the_recorded_calls(models, p, threshold, mode, steps_per_read):
    """(``steps_per_read=3``: the record and the forced replay launch steps ahead; a step launched after
    its block's last one neither records nor forces a step.)"""
    recorder, other = models
    prompt = torch.tensor(p, dtype=torch.long)
    record, seen_by_recorder = StepRecorder(), Logged(recorder)
    rec = decode(recorder, prompt, threshold, mode, forward=seen_by_recorder, trace=record,
                 steps_per_read=steps_per_read)
    assert len(record.steps) == rec.num_calls
    # another model at another threshold decides otherwise on its own ...
    own = decode(other, prompt, 0.9, mode)
    # ... and, forced, makes the recorded calls and commits the recorded tokens
    forcing = StepForcing(record.steps, record.seeds, torch.device("cpu"))
    seen = Logged(other)
    forced = decode(other, prompt, 0.9, mode, forward=seen, trace=forcing, steps_per_read=steps_per_read)
    assert (forced.tokens, forced.nfe, calls(forced)) == (rec.tokens, rec.nfe, calls(rec))
    assert len(seen.inputs) == len(seen_by_recorder.inputs)
    for (rows, parents), (rec_rows, rec_parents) in zip(seen.inputs, seen_by_recorder.inputs):
        assert torch.equal(rows, rec_rows) and torch.equal(parents, rec_parents)
    assert int(forcing.index) == len(record.steps) and forcing.seed_index == len(record.seeds)
    if (own.tokens, calls(own)) == (rec.tokens, calls(rec)):
        return  # nothing to tell the forcing apart on this prompt
    assert (forced.tokens, calls(forced)) != (own.tokens, calls(own))


def test_forced_token_map_and_seek(models):
    recorder, other = models
    prompts = [torch.tensor([5, 9, 33, 70, 2], dtype=torch.long), torch.tensor([40, 41], dtype=torch.long)]
    recs, steps, seeds, offsets = [], [], [], []
    for prompt in prompts:
        record = StepRecorder()
        recs.append(decode(recorder, prompt, 0.3, trace=record))
        offsets.append((len(steps), len(seeds)))
        steps, seeds = steps + record.steps, seeds + record.seeds
    # the record's ids moved one up in the replaying vocabulary (mask and eos kept)
    table = torch.arange(128)
    cfg = recorder.config
    table[2:126] += 1
    table[cfg.mask_token_id], table[cfg.eos_token_id] = cfg.mask_token_id, cfg.eos_token_id
    forcing = StepForcing(steps, seeds, torch.device("cpu"), token_map=table)
    for i in (1, 0):  # out of order: each decode seeks to its own steps
        forcing.seek(*offsets[i])
        forced = decode(other, table[prompts[i]], 0.9, trace=forcing)
        assert forced.tokens == table[torch.tensor(recs[i].tokens)].tolist()
        assert calls(forced) == calls(recs[i])


def test_forced_masks_reach_every_gate(models):
    recorder, other = models
    prompt = torch.tensor([7, 19, 3, 88, 41, 52, 9], dtype=torch.long)
    folded = torch.compile(recorder, backend=SpecFoldBackend(tau=0.2, kernels="torch", fold_min_branches=2))
    with fold_launched_calls(), recorded_fold_masks() as masks:
        record = StepRecorder(masks)
        rec = decode(recorder, prompt, 0.3, forward=folded, trace=record)
    recorded = [s.masks for s in record.steps if s.masks is not None]
    assert recorded and any(m.any() for m in recorded), "the record folded nothing"
    gates = recorded[0].shape[0]
    target = torch.compile(other, backend=SpecFoldBackend(tau=0.9, kernels="torch", fold_min_branches=2))
    forcing = StepForcing(record.steps, record.seeds, torch.device("cpu"), gates=gates)
    with fold_launched_calls(), forced_fold_masks(forcing.fold_masks), recorded_fold_masks() as seen:
        forced = decode(other, prompt, 0.9, forward=target, trace=forcing)
    assert (forced.tokens, calls(forced)) == (rec.tokens, calls(rec))
    folded_calls = [s for s in record.steps if s.masks is not None]
    assert len(seen) == gates * len(folded_calls)
    for k, step in enumerate(folded_calls):
        n = seen[k * gates][1].shape[0]
        for g in range(gates):
            index, mask = seen[k * gates + g]
            assert index == g and torch.equal(mask, step.masks[g, :n])


def test_step_forcing_arguments():
    with pytest.raises(ValueError, match="steps"):
        StepForcing([], [], torch.device("cpu"))
    step = RecordedStep(torch.zeros((3, 8), dtype=torch.long), torch.zeros(3, dtype=torch.long), 1,
                        torch.zeros(len(STATUS_FIELDS) + 3, dtype=torch.long))
    old = RecordedStep(step.rows, step.parents, 1, torch.zeros(len(STATUS_FIELDS) + 2, dtype=torch.long))
    with pytest.raises(ValueError, match="steps: status words of 8 entries, expected 6 fields .* and 3 parents"):
        StepForcing([old], [], torch.device("cpu"))
    forcing = StepForcing([step], [], torch.device("cpu"), gates=4)
    assert forcing.masks is None and tuple(forcing.fold_masks.shape) == (4, 3, 8)
    with pytest.raises(RuntimeError, match="seed 1 of a record of 0"):
        forcing.seed(3)
