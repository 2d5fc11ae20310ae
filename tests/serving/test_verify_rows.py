"""``Engine(max_verify_rows=R)``: a verification forward holds at most R rows (or one main a request, when
more requests are ready than R), the drafts sharing what the mains leave, and the lossless modes decode the same tokens
as each prompt alone under any limit; a limit that every step fits in changes nothing at all."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specfold_compile
from specfold_compile.decoding import generate as generate_one
from specfold_compile.serving import Engine, RequestParams
from specfold_compile.testing import TINY_FAMILIES as FAMILIES, tiny_model

HSET = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
LOSSLESS = [("vanilla", None), ("spiffy", None), ("specfold", 0.0)]


def _prompts(model, lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, model.config.vocab_size, (n,), generator=gen) for n in lengths]


class _Drafting:
    """A ready request that has ``drafts`` drafts to offer: its rows under a budget (``RequestDecode.rows``)."""

    def __init__(self, drafts):
        self.drafts, self.asked = drafts, None

    def rows(self, draft_budget=None):
        self.asked = draft_budget
        return torch.zeros(1 + min(self.drafts, 99 if draft_budget is None else draft_budget), 4)


def test_the_drafts_share_the_rows_the_mains_leave(model):
    """Twelve rows, four requests: eight for drafts, each request in turn an even share of what is still
    free, so the rows the first two leave unused go to the last ones."""
    engine = Engine(model, mode="spiffy", max_verify_rows=12)
    ready = [_Drafting(n) for n in (0, 10, 2, 10)]
    assert [int(r.shape[0]) for r in engine.rows_for(ready)] == [1, 3, 3, 5]
    assert [d.asked for d in ready] == [2, 2, 3, 4]
    assert [int(r.shape[0]) for r in engine.rows_for([_Drafting(20)])] == [12]
    assert [int(r.shape[0]) for r in engine.rows_for([_Drafting(5) for _ in range(12)])] == [1] * 12
    assert [int(r.shape[0]) for r in engine.rows_for([_Drafting(5) for _ in range(13)])] == [1] * 13
    free = [_Drafting(20), _Drafting(20)]
    assert [int(r.shape[0]) for r in Engine(model, mode="spiffy").rows_for(free)] == [21, 21]
    assert [d.asked for d in free] == [None, None]


@settings(max_examples=12, **HSET)
@given(family=st.sampled_from(FAMILIES), mode=st.sampled_from(LOSSLESS), seed=st.integers(0, 999),
       lengths=st.lists(st.integers(1, 40), min_size=1, max_size=5), max_new_tokens=st.integers(1, 48),
       draft_budget=st.integers(0, 8), max_verify_rows=st.integers(1, 20), max_requests=st.integers(1, 5))
def test_rows_stay_within_the_limit_and_tokens_stay_the_same(family, mode, seed, lengths, max_new_tokens,
                                                            draft_budget, max_verify_rows, max_requests):
    model = tiny_model(family)
    mode, tau = mode
    engine = Engine(model, max_requests=max_requests, max_tokens_per_request=128, mode=mode, tau=tau,
                    max_verify_rows=max_verify_rows)
    params = RequestParams(max_new_tokens=max_new_tokens, draft_budget=draft_budget)
    prompts = _prompts(model, lengths, seed)
    ids = [engine.add_request(p, params) for p in prompts]
    while engine.has_work:
        rows, requests = engine.stats.verify_rows, engine.stats.verify_requests
        engine.step()
        rows, requests = engine.stats.verify_rows - rows, engine.stats.verify_requests - requests
        assert rows <= max(max_verify_rows, requests)
    for rid, prompt in zip(ids, prompts):
        alone = generate_one(model, prompt, mode=mode, max_new_tokens=max_new_tokens, draft_budget=draft_budget,
                             **({} if tau is None else {"tau": tau}))
        assert engine.output(rid).result.tokens == alone.tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_a_limit_every_step_fits_in_changes_nothing(family):
    """One request, the limit its budget's rows: the same tokens, acceptances and forwards as alone."""
    model = tiny_model(family)
    prompt = _prompts(model, [9], 3)[0]
    alone = generate_one(model, prompt, mode="spiffy", max_new_tokens=40, draft_budget=4)
    batched, = specfold_compile.generate(model, [prompt], mode="spiffy", max_new_tokens=40, draft_budget=4,
                                         max_verify_rows=5)
    assert batched.tokens == alone.tokens and batched.nfe == alone.nfe
    assert [s.accepted for s in batched.steps] == [s.accepted for s in alone.steps]
    assert [s.branches for s in batched.steps] == [s.branches for s in alone.steps]


def test_a_limit_of_one_row_a_request_runs_vanilla_forwards(model):
    """As many requests as rows: no drafts, so Spiffy makes vanilla's forwards, with the same tokens."""
    prompts = _prompts(model, [5, 12, 7], 1)
    spiffy = specfold_compile.generate(model, prompts, mode="spiffy", max_new_tokens=40, max_verify_rows=3,
                                       max_requests=3)
    vanilla = specfold_compile.generate(model, prompts, mode="vanilla", max_new_tokens=40)
    free = specfold_compile.generate(model, prompts, mode="spiffy", max_new_tokens=40)
    assert [r.tokens for r in spiffy] == [r.tokens for r in vanilla] == [r.tokens for r in free]
    # the three run together until the first finishes, with no drafts; then two requests share three
    # rows, one draft each at most: here that lands between the free decode's forwards and vanilla's
    for lim, van, fr in zip(spiffy, vanilla, free):
        assert fr.nfe <= lim.nfe <= van.nfe
    assert any(r.nfe > f.nfe for r, f in zip(spiffy, free))


def test_max_verify_rows_argument(model):
    for bad in (0, -3, 2.0, True, "8"):
        with pytest.raises(ValueError, match=r"^max_verify_rows: expected None or an int >= 1, got "):
            Engine(model, mode="spiffy", max_verify_rows=bad)
    with pytest.raises(ValueError, match=r"^max_verify_rows: expected None or an int >= 1, got 0$"):
        specfold_compile.generate(model, [_prompts(model, [4], 0)[0]], mode="spiffy", max_verify_rows=0)


def test_a_specfold_step_without_drafts_runs_the_plain_forward(model, monkeypatch):
    """No request with a draft: the plain batched forward (a main row never folds), and masks that fold
    nothing noted for each request's call."""
    from specfold_compile.serving import engine as engine_module

    folded = []
    monkeypatch.setattr(engine_module, "verify_batch_folded", lambda *a, **k: folded.append(a) or None)
    prompts = _prompts(model, [6, 11], 2)
    engine = Engine(model, max_requests=2, max_tokens_per_request=128, mode="specfold", tau=0.3, max_verify_rows=1)
    ids = [engine.add_request(p, RequestParams(max_new_tokens=24)) for p in prompts]
    list(engine.run())
    assert not folded and engine.stats.gated_draft_positions == 0
    for rid, prompt in zip(ids, prompts):
        masks = engine.output(rid).fold_masks
        assert len(masks) == len(engine.output(rid).result.steps)
        assert all(m.shape == (len(model.layers), 1, model.config.block_size) and not m.any() for m in masks)
        assert engine.output(rid).result.tokens == generate_one(model, prompt, max_new_tokens=24).tokens
