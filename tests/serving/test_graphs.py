"""The engine's batched passes replayed from graphs bucketed by rows (``serving.graphs.BatchGraphs``), run
here with ``replay="eager"`` (the same static buffers, padding and bookkeeping, the function called again
instead of a CUDA graph): the engine's tokens, stats and fold masks against the launched engine with
ragged attention, overflowed forwards replayed at a larger capacity, graphs shared between engines, the
pool's spare slot taking the padding's block writes, and one replayed verification forward against
``verify_batch``."""
import copy
import functools

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from specfold_compile.decoding.commit import confidence
from specfold_compile.decoding.defaults import CONFIDENCE_DTYPES
from specfold_compile.serving import Engine, PoolExhausted, RequestParams, verify_batch_folded
from specfold_compile.serving.forward import verify_batch, write_blocks
from specfold_compile.serving.graphs import BatchGraphs, request_bucket
from specfold_compile.serving.request import seed_tokens
from specfold_compile.testing import (TINY_FAMILIES as FAMILIES, assert_close, prefilled_slots, realistic_tree,
                                      tiny_model)

HSET = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=3)


# --- the engine: replayed (eager) against launched ragged ----------------------------------------

def _workload(seed: int, lengths, budgets, thresholds):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 90, (n,), generator=gen) for n in lengths]
    params = [RequestParams(max_new_tokens=m, stop_at_eos=False, threshold=t, draft_budget=3)
              for m, t in zip(budgets, thresholds)]
    return list(zip(prompts, params))


# three requests (on two slots the third joins when one leaves): prompts shorter and longer than a block
# (16), one crossing a block boundary (a block write under fast-dLLM v2); low thresholds commit a few
# tokens a call (fewer calls under the interpreter), 0.9 one a call
WORKLOAD = dict(seed=3, lengths=(5, 19, 12), budgets=(3, 2, 5), thresholds=(0.2, 0.9, 0.15))
MAX_TOKENS = 64
# the fields of EngineStats the replayed engine must match (``overflows`` is its own)
STATS = ("verify_calls", "verify_rows", "verify_requests", "write_calls", "written_blocks", "prefills",
         "gated_draft_positions", "folded_draft_positions")


def _decode(engine):
    """Run WORKLOAD on ``engine``; returns (tokens, stats, fold masks): each request's fold masks copied
    in the step that recorded them (``test_kept_fold_masks_survive_later_replays`` checks the records
    themselves after the run); ``stats`` also holds how many requests still waited after the first step."""
    ids = [engine.add_request(p, r) for p, r in _workload(**WORKLOAD)]
    masks = {i: [] for i in ids}
    waited = None
    while engine.has_work:
        engine.step()
        waited = engine.num_waiting if waited is None else waited
        for i in ids:
            masks[i] += [m.clone() for m in engine.output(i).fold_masks[len(masks[i]):]]
    assert all(engine.output(i).status == "finished" for i in ids)
    stats = {name: getattr(engine.stats, name) for name in STATS}
    stats["waited"] = waited
    return [engine.output(i).result.tokens for i in ids], stats, [masks[i] for i in ids]


@functools.lru_cache(maxsize=None)
def _launched(family, mode, tau, max_requests=2):
    """The launched engine's run of WORKLOAD (ragged attention, no graphs), kept for the whole file."""
    engine = Engine(tiny_model(family), max_requests, MAX_TOKENS, mode=mode, tau=tau, attention="ragged")
    out = _decode(engine)
    assert engine.graphs is None and engine.stats.overflows == 0
    return out


def _assert_same_masks(got, want, what):
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert len(g) == len(w), (what, i)
        for call, (a, b) in enumerate(zip(g, w)):
            assert a.dtype == torch.bool and a.shape == b.shape, (what, i, call, a.shape, b.shape)
            assert torch.equal(a, b), f"{what}: request {i} call {call}: {int((a != b).sum())} positions differ"


@pytest.mark.parametrize("family, mode, tau, attention", [
    (FAMILIES[0], "vanilla", None, "auto"),
    (FAMILIES[1], "spiffy", None, "ragged"),
    (FAMILIES[1], "specfold", 0.0, "auto"),
    (FAMILIES[0], "specfold", 0.3, "ragged"),
])
def test_eager_graphs_decode_the_launched_tokens(family, mode, tau, attention):
    model = tiny_model(family)
    # SpecFold: no floor on the packed positions (the tiny rows are fewer than MIN_PACKED), so the
    # graphs pack fold_capacity of them
    graphs = "eager"
    if mode == "specfold":
        graphs = BatchGraphs(model, 2, MAX_TOKENS, "eager", min_packed=0, capacity_spread=0)
    engine = Engine(model, 2, MAX_TOKENS, mode=mode, tau=tau, attention=attention, cuda_graphs=graphs)
    assert engine.attention == "ragged" and isinstance(engine.graphs, BatchGraphs)
    assert engine.pool is engine.graphs.pool and engine.graphs.replay == "eager"
    tokens, stats, masks = _decode(engine)
    ref_tokens, ref_stats, ref_masks = _launched(family, mode, tau)
    assert tokens == ref_tokens
    assert [len(t) for t in tokens] == list(WORKLOAD["budgets"])
    assert stats == ref_stats
    assert engine.stats.overflows == 0
    assert stats["verify_requests"] > stats["verify_calls"]  # requests verified together
    assert stats["waited"] == 1  # the third request joined when a slot freed
    if family == FAMILIES[0]:
        assert stats["write_calls"] > 0  # a block write went through the graphs
    if mode != "vanilla":
        assert stats["verify_rows"] > stats["verify_requests"]  # drafts: more rows than requests
    if mode == "specfold":
        assert sum(len(m) for m in masks) == stats["verify_requests"]  # one record a request a call
        _assert_same_masks(masks, ref_masks, f"{family} tau={tau}")
        if tau > 0:
            assert 0 < stats["folded_draft_positions"] < stats["gated_draft_positions"]  # some folded, not all
        else:
            assert stats["folded_draft_positions"] == 0 < stats["gated_draft_positions"]
    else:
        assert all(m == [] for m in masks) and stats["gated_draft_positions"] == 0
    graphs = engine.graphs
    assert graphs.captures > 0 and graphs.replays > 0  # some bucket came back
    assert graphs.captures + graphs.replays >= stats["verify_calls"] + stats["write_calls"]
    assert graphs.pool.used_slots == 0


def test_rows_built_while_a_block_write_runs_are_the_rows_after_it():
    """The replayed engine builds the next rows of the requests a block write leaves alone while that write
    runs (``Engine._rows_ahead``): the tokens and forwards stay the launched engine's; none is built ahead
    with ``max_verify_rows`` (rows shared out among the next step's requests) or ``rows_ahead`` off."""
    model = tiny_model(FAMILIES[0])
    workload = _workload(seed=5, lengths=(5, 12), budgets=(30, 12), thresholds=(0.1, 0.5))

    def run(engine):
        ids = [engine.add_request(p, r) for p, r in workload]
        list(engine.run())
        return [engine.output(i).result.tokens for i in ids], engine.stats

    want, launched = run(Engine(model, 2, MAX_TOKENS, mode="spiffy", attention="ragged"))
    got, replayed = run(Engine(model, 2, MAX_TOKENS, mode="spiffy", cuda_graphs="eager"))
    assert got == want and launched.rows_built_ahead == 0
    assert (replayed.verify_calls, replayed.verify_rows, replayed.write_calls) == (
        launched.verify_calls, launched.verify_rows, launched.write_calls)
    assert replayed.write_calls > 0 and replayed.rows_built_ahead > 0
    switched_off = Engine(model, 2, MAX_TOKENS, mode="spiffy", cuda_graphs="eager")
    switched_off.rows_ahead = False
    for engine in (Engine(model, 2, MAX_TOKENS, mode="spiffy", cuda_graphs="eager", max_verify_rows=4), switched_off):
        assert run(engine)[0] == want and engine.stats.rows_built_ahead == 0


def test_kept_fold_masks_survive_later_replays():
    """The fold masks an engine keeps (``RequestOutput.fold_masks``), read after the run, are those it
    recorded in each step (there the launched engine's: ``test_eager_graphs_decode_the_launched_tokens``),
    not overwritten by later replays of the same graph."""
    # the tiny rows are fewer than MIN_PACKED: every graph packs every position, one graph a row bucket
    engine = Engine(tiny_model(FAMILIES[0]), 2, MAX_TOKENS, mode="specfold", tau=0.3, cuda_graphs="eager")
    workload = dict(seed=9, lengths=(10, 4), budgets=(8, 8), thresholds=(0.9, 0.5))
    ids = [engine.add_request(p, r) for p, r in _workload(**workload)]
    recorded, folded_steps = {i: [] for i in ids}, 0
    while engine.has_work:
        engine.step()
        new = {i: engine.output(i).fold_masks[len(recorded[i]):] for i in ids}
        folded_steps += any(m.shape[1] > 1 for ms in new.values() for m in ms)  # a step with drafts
        for i in ids:
            recorded[i] += [m.clone() for m in new[i]]
    assert sum(len(m) for m in recorded.values()) == engine.stats.verify_requests
    # a step without drafts runs the plain forward's graph; more steps with drafts than folded graphs
    # captured: some folded graph was replayed again
    assert folded_steps > sum(1 for key in engine.graphs.graphs if key[0] == "verify" and key[5])
    _assert_same_masks([engine.output(i).fold_masks for i in ids], [recorded[i] for i in ids], "kept masks")


@pytest.mark.parametrize("capacity", [0.01, "per gate", 1.0])
def test_overflowed_forwards_replay_at_a_larger_capacity(capacity):
    """A tiny ``fold_capacity`` (for every gate, or for every other gate) overflows a graph's packed rows
    (three requests on three slots: the graph's rows of main branches are all taken): those forwards are
    replayed from the next capacity level's graphs, and the tokens, stats and fold masks stay the
    launched engine's. ``fold_capacity=1.0`` packs every position: no overflow."""
    family, mode, tau = FAMILIES[0], "specfold", 0.5
    model = tiny_model(family)
    if capacity == "per gate":
        capacity = tuple(0.01 if g % 2 else 1.0 for g in range(len(model.layers)))
    ref_tokens, ref_stats, ref_masks = _launched(family, mode, tau, 3)
    graphs = BatchGraphs(model, 3, MAX_TOKENS, "eager", fold_capacity=capacity, min_packed=0)
    engine = Engine(model, 3, MAX_TOKENS, mode=mode, tau=tau, cuda_graphs=graphs)
    assert engine.graphs.fold_capacity == capacity
    tokens, stats, masks = _decode(engine)
    assert tokens == ref_tokens and stats == ref_stats
    _assert_same_masks(masks, ref_masks, f"fold_capacity={capacity}")
    levels = {key[7] for key in graphs.graphs if key[0] == "verify"}  # the packed positions a gate
    if capacity != 1.0:
        assert 0 < engine.stats.overflows and len(levels) > 1
    else:
        assert engine.stats.overflows == 0


def test_the_device_loop_overflows_as_the_host_loop():
    """Under ``loop="device"`` the folded forward is not waited for: its masks and overflow flag come back
    with the step's results. An overflowed forward puts the calls in flight back, replays at the next
    capacity level and steps again: the host loop's tokens, stats, masks and overflows."""
    family, mode, tau = FAMILIES[0], "specfold", 0.5
    model = tiny_model(family)
    ref_tokens, ref_stats, ref_masks = _launched(family, mode, tau, 3)
    engines = {loop: Engine(model, 3, MAX_TOKENS, mode=mode, tau=tau, loop=loop, cuda_graphs=BatchGraphs(
        model, 3, MAX_TOKENS, "eager", fold_capacity=0.01, min_packed=0)) for loop in ("host", "device")}
    for loop, engine in engines.items():
        tokens, stats, masks = _decode(engine)
        assert tokens == ref_tokens and stats == ref_stats, loop
        _assert_same_masks(masks, ref_masks, loop)
    assert engines["device"].stats.overflows == engines["host"].stats.overflows > 0


# --- graphs shared between engines, argument errors ----------------------------------------------

def test_graphs_are_reused_by_the_next_engine():
    family, mode = FAMILIES[0], "vanilla"
    model = tiny_model(family)
    ref_tokens, ref_stats, _ = _launched(family, mode, None)
    graphs = BatchGraphs(model, 2, MAX_TOKENS, replay="eager")
    assert graphs.replay == "eager" and graphs.captures == graphs.replays == 0
    first = Engine(model, 2, MAX_TOKENS, mode=mode, cuda_graphs=graphs)
    assert first.graphs is graphs and first.pool is graphs.pool
    ids = [first.add_request(p, r) for p, r in _workload(**WORKLOAD)]
    first.step()
    assert graphs.pool.used_slots == 2
    with pytest.raises(ValueError, match="^cuda_graphs: 2 of its pool's slots are still in use by another engine"):
        Engine(model, 2, MAX_TOKENS, mode=mode, cuda_graphs=graphs)
    list(first.run())
    assert [first.output(i).result.tokens for i in ids] == ref_tokens
    captures, replays = graphs.captures, graphs.replays
    assert captures > 0 and captures + replays >= ref_stats["verify_calls"] + ref_stats["write_calls"]
    assert graphs.pool.used_slots == 0

    second = Engine(model, 2, MAX_TOKENS, mode=mode, cuda_graphs=graphs)
    assert second.graphs is graphs
    tokens, stats, _ = _decode(second)
    assert tokens == ref_tokens and stats == ref_stats
    assert graphs.captures == captures  # the same buckets: every graph already there
    assert graphs.replays - replays == captures + replays  # as many passes as the first run, all replayed


def test_shared_graphs_are_refused_by_a_mismatched_engine():
    model, other = tiny_model(FAMILIES[0]), tiny_model(FAMILIES[1])
    graphs = BatchGraphs(model, 2, 48, replay="eager")
    with pytest.raises(ValueError, match=r"^cuda_graphs: its pool has 2 slots of 48 positions, the engine asks "
                                         r"3 of 48"):
        Engine(model, 3, 48, cuda_graphs=graphs)
    with pytest.raises(ValueError, match=r"^cuda_graphs: its pool has 2 slots of 48 positions, the engine asks "
                                         r"2 of 64"):
        Engine(model, 2, 64, cuda_graphs=graphs)
    with pytest.raises(ValueError, match="^cuda_graphs: a BatchGraphs made for another model"):
        Engine(other, 2, 48, cuda_graphs=graphs)
    fewer = Engine(model, 1, 48, cuda_graphs=graphs)  # fewer slots than the pool: fine
    assert fewer.pool is graphs.pool and fewer.max_requests == 1


@pytest.mark.parametrize("make, match", [
    (lambda m: Engine(m, cuda_graphs="yes"), r"^cuda_graphs: expected False, True, 'eager' or a BatchGraphs, "
                                             r"got 'yes'"),
    (lambda m: Engine(m, cuda_graphs=1), r"^cuda_graphs: expected False, True, 'eager' or a BatchGraphs, got 1"),
    (lambda m: Engine(m, cuda_graphs="cuda"), r"^cuda_graphs: expected "),
    (lambda m: Engine(m, cuda_graphs="eager", attention="per_request"),
     r"^attention: cuda_graphs replays the ragged attention \('auto' or 'ragged'\), got 'per_request'"),
    (lambda m: Engine(m, cuda_graphs=True), r"^replay: 'cuda' needs the model on a CUDA device, got cpu"),
    (lambda m: BatchGraphs(m, 2, 32, replay="cuda"), r"^replay: 'cuda' needs the model on a CUDA device"),
    (lambda m: BatchGraphs(m, 2, 32, replay="graph"), r"^replay: expected one of \('cuda', 'eager'\), got 'graph'"),
    (lambda m: Engine(m, cuda_graphs="eager", fold_capacity=0), r"^fold_capacity: expected a number in \(0, 1\]"),
    (lambda m: Engine(m, cuda_graphs="eager", fold_capacity=1.5), r"^fold_capacity: expected a number in \(0, 1\]"),
    (lambda m: BatchGraphs(m, 2, 32, "eager", fold_capacity=1.5), r"^fold_capacity: .* got 1\.5"),
    (lambda m: BatchGraphs(m, 2, 32, "eager", fold_capacity=-0.5), r"^fold_capacity: .* got -0\.5"),
    (lambda m: BatchGraphs(m, 2, 32, "eager", fold_capacity=True), r"^fold_capacity: .* got True"),
    (lambda m: BatchGraphs(m, 2, 32, "eager", fold_capacity="0.5"), r"^fold_capacity: .* got '0\.5'"),
    (lambda m: BatchGraphs(m, 2, 32, "eager", fold_capacity=(0.5,) * 5), r"^fold_capacity: .*, 2 of them, got 5"),
    (lambda m: BatchGraphs(m, 2, 32, "eager", fold_capacity=(0.5, 2)), r"^fold_capacity: .* got 2$"),
    (lambda m: BatchGraphs(m, 2, 32, "eager", min_packed=-1), r"^min_packed: expected an int >= 0"),
    (lambda m: BatchGraphs(m, 2, 32, "eager", capacity_spread=-1), r"^capacity_spread: expected a number >= 0"),
])
def test_graph_arguments_are_checked(make, match):
    if torch.cuda.is_available() and "CUDA device" in match:
        pytest.skip("the model would be on a CUDA device")
    with pytest.raises(ValueError, match=match) as info:
        make(tiny_model(FAMILIES[0]))
    assert "\n" not in str(info.value)


def test_graphs_on_the_engine_keep_its_own_checks():
    model = tiny_model(FAMILIES[0])
    for capacity in (0.25, 1, 1.0):
        assert Engine(model, 2, 32, cuda_graphs="eager", fold_capacity=capacity).graphs.fold_capacity == capacity
    assert Engine(model, 2, 32).graphs is None
    with pytest.raises(ValueError, match="^tau: mode='specfold' needs the fold threshold"):
        Engine(model, 2, 32, mode="specfold", cuda_graphs="eager")


# --- the pool's spare slot and the padded block writes -------------------------------------------

def _fill(pool, slots, lengths, gen):
    """Random K/V prefixes (never zero) of ``lengths`` loaded into ``slots``."""
    shape = pool.keys[0].shape
    for slot, length in zip(slots, lengths):
        keys = [torch.randn(shape[1], length, shape[3], generator=gen) for _ in pool.keys]
        values = [torch.randn(shape[1], length, shape[3], generator=gen) for _ in pool.keys]
        pool.load(slot, keys, values)


@pytest.mark.parametrize("family, n_write", [(FAMILIES[0], 3), (FAMILIES[1], 5)])
def test_padded_block_writes_land_in_the_spare_slot(family, n_write):
    """``BatchGraphs.write`` pads the blocks to a power of two into the pool's spare slot (never handed out):
    the written slots get ``write_blocks``' K/V and seeds, every other slot keeps its buffers."""
    model = tiny_model(family)
    gen = torch.Generator().manual_seed(n_write)
    n_slots, block = n_write + 1, model.config.block_size
    graphs = BatchGraphs(model, n_slots, 48, replay="eager")
    pool = graphs.pool
    assert pool.spare == n_slots and pool.keys[0].shape[0] == n_slots + 1
    slots = [pool.allocate() for _ in range(n_slots)]
    assert sorted(slots) == list(range(n_slots))  # the spare slot is never handed out
    with pytest.raises(PoolExhausted):
        pool.allocate()
    written = [slots[i] for i in torch.randperm(n_slots, generator=gen)[:n_write].tolist()]
    idle = [s for s in slots if s not in written]
    lengths = [int(x) for x in torch.randint(1, 48 - block, (n_slots,), generator=gen)]
    lengths[slots.index(written[0])] = 0  # a written slot with an empty prefix
    _fill(pool, slots, lengths, gen)
    assert request_bucket(n_write - 1) > n_write  # padded: fewer blocks than the graph's
    blocks = [torch.randint(0, model.config.vocab_size, (block,), generator=gen) for _ in written]
    twin = copy.deepcopy(pool)
    before = [(k.clone(), v.clone()) for k, v in zip(pool.keys, pool.values)]
    with torch.inference_mode():
        seeds = graphs.write(written, blocks)
        next_logits = write_blocks(model, twin, written, blocks, attention="ragged")
    assert seeds == seed_tokens(torch.stack(next_logits), int(model.config.mask_token_id))
    assert pool.lengths == twin.lengths
    for s in written:
        assert pool.lengths[s] == dict(zip(slots, lengths))[s] + block
    for layer, (k0, v0) in enumerate(before):
        for buf, old, ref in ((pool.keys[layer], k0, twin.keys[layer]), (pool.values[layer], v0, twin.values[layer])):
            for s in idle:
                assert torch.equal(buf[s], old[s]), (layer, s)  # untouched
            for s in written:
                length = pool.lengths[s] - block
                assert torch.equal(buf[s, :, :length], old[s, :, :length]), (layer, s)  # the prefix kept
                assert torch.equal(buf[s, :, length + block:], old[s, :, length + block:]), (layer, s)
                assert_close(buf[s, :, length:length + block], ref[s, :, length:length + block],
                             what=f"{family} layer {layer} slot {s}")
                assert not torch.equal(buf[s, :, length:length + block], old[s, :, length:length + block])
            spare = pool.spare
            assert not torch.equal(buf[spare, :, :block], old[spare, :, :block])  # the padding went there
            assert torch.equal(buf[spare, :, block:], old[spare, :, block:])
    assert graphs.captures == 1 and graphs.replays == 0


# --- one replayed verification forward against verify_batch ---------------------------------------

def _graphs_with_prefixes(model, lengths, gen, **kwargs):
    """A BatchGraphs whose pool has one slot more than requests (the requests' slots not 0..n-1 in order),
    each request's prompt prefilled into its slot (``testing.prefilled_slots``)."""
    graphs = BatchGraphs(model, len(lengths) + 1, 40, replay="eager", **kwargs)
    return graphs, prefilled_slots(graphs.pool, model, lengths, gen)


def _masked_rows(model, counts, gen):
    """Random rows (about half masked; every row 0 has a masked position) and their masked positions."""
    block, mask = model.config.block_size, model.config.mask_token_id
    rows, positions = [], []
    for n in counts:
        r = torch.randint(0, model.config.vocab_size - 1, (n, block), generator=gen)
        r[r == mask] = mask - 1
        r[torch.rand(n, block, generator=gen) < 0.5] = mask
        r[0, int(torch.randint(0, block, (1,), generator=gen))] = mask
        rows.append(r)
        positions.append((r == mask).flatten().nonzero().flatten())
    return rows, positions


def _confidence(model, logits, dtype):
    conf, tok = confidence(torch.cat(logits), int(model.config.mask_token_id), dtype,
                           model.config.decoding_rules.argmax_of_probs)
    return conf, tok


@settings(**HSET)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**16),
       lengths=st.lists(st.integers(0, 33), min_size=1, max_size=3),
       counts=st.lists(st.integers(1, 3), min_size=3, max_size=3),
       dtype=st.sampled_from(CONFIDENCE_DTYPES))
@example(family=FAMILIES[0], seed=1, lengths=[0], counts=[3, 1, 1], dtype="float32")  # one request, no prefix
@example(family=FAMILIES[1], seed=2, lengths=[23, 0, 9], counts=[1, 3, 2], dtype="model")
def test_replayed_verify_is_verify_batch(family, seed, lengths, counts, dtype):
    """The replayed forward over ragged requests (rows and logit positions padded to their buckets, the
    padding request on the spare slot) gives the commit rule's inputs of ``verify_batch``'s logits."""
    model = tiny_model(family)
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        graphs, slots = _graphs_with_prefixes(model, lengths, gen)
        before = list(graphs.pool.lengths)
        rows, positions = _masked_rows(model, counts[:len(lengths)], gen)
        res = graphs.verify(slots, rows, positions, dtype)
        conf, tok = _confidence(model, verify_batch(model, graphs.pool, slots, rows, positions, attention="ragged"),
                                dtype)
    assert res.masks is None and res.overflows == 0
    assert res.tok.dtype == torch.int64 and torch.equal(res.tok, tok)
    assert_close(res.conf, conf, what=family)
    assert graphs.captures == 1 and graphs.replays == 0
    assert graphs.pool.lengths == before and [before[s] for s in slots] == lengths[::-1]  # nothing written


@settings(**HSET)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**16),
       lengths=st.lists(st.integers(0, 33), min_size=1, max_size=2),
       counts=st.lists(st.integers(1, 4), min_size=2, max_size=2),
       tau=st.sampled_from([0.0, 0.3, 0.6]), forced=st.booleans())
@example(family=FAMILIES[1], seed=5, lengths=[0], counts=[4, 1], tau=0.3, forced=False)  # one request, no prefix
def test_replayed_folded_verify_is_verify_batch_folded(family, seed, lengths, counts, tau, forced):
    """SpecFold: the replayed folded forward (``fold_capacity=1.0``: every position packed, no overflow)
    gives ``verify_batch_folded``'s fold masks (gated, or ``forced``) and confidences, the padding rows
    dropped."""
    model = tiny_model(family)
    gen = torch.Generator().manual_seed(seed)
    mask, block = model.config.mask_token_id, model.config.block_size
    with torch.inference_mode():
        graphs, slots = _graphs_with_prefixes(model, lengths, gen, fold_capacity=1.0)
        rows, parents, positions, folds = [], [], [], []
        for i, n in enumerate(counts[:len(lengths)]):
            r, p = realistic_tree(model, n, seed + i)
            rows.append(r)
            parents.append(p)
            positions.append((r == mask).flatten().nonzero().flatten())
            f = torch.rand(len(model.layers), n, block, generator=gen) < 0.6
            f[:, 0] = False  # a main row never folds
            folds.append(f)
        folds = folds if forced else None
        res = graphs.verify(slots, rows, positions, "float32", [p.tolist() for p in parents], tau, folds)
        logits, masks = verify_batch_folded(model, graphs.pool, slots, rows, parents, positions, tau, folds,
                                            attention="ragged")
        conf, tok = _confidence(model, logits, "float32")
    assert res.overflows == 0
    _assert_same_masks([res.masks], [masks], family)
    if forced:
        _assert_same_masks([res.masks], [folds], "forced")
    assert torch.equal(res.tok, tok)
    assert_close(res.conf, conf, what=family)


def test_replayed_results_keep_their_fold_masks():
    """Two folded forwards through one graph (the same bucket): the first one's masks, handed back on the
    host, are not overwritten by the second replay."""
    model = tiny_model(FAMILIES[0])
    gen = torch.Generator().manual_seed(7)
    block = model.config.block_size
    with torch.inference_mode():
        graphs, slots = _graphs_with_prefixes(model, [6, 11], gen)
        rows, _ = _masked_rows(model, [2, 1], gen)
        positions = [torch.tensor([0, 17, 5]), torch.tensor([3, 9])]  # as many in both calls: one bucket
        gates = len(model.layers)
        folds = torch.zeros(gates, 2, block, dtype=torch.bool)
        folds[:, 1] = torch.rand(gates, block, generator=gen) < 0.5  # the draft folds where forced
        folds[:, 1, 0] = True
        first = graphs.verify(slots, rows, positions, "float32", [[-1, 0], [-1]], 0.3,
                              [folds, torch.zeros(gates, 1, block, dtype=torch.bool)])
        kept = [m.clone() for m in first.masks]
        assert torch.equal(kept[0], folds)
        rows2, _ = _masked_rows(model, [1, 1], gen)
        positions2 = [torch.tensor([2, 4]), torch.tensor([1, 8, 15])]
        graphs.verify(slots, rows2, positions2, "float32", [[-1], [-1]], 0.3,
                      [torch.zeros(gates, 1, block, dtype=torch.bool)] * 2)
        assert graphs.captures == 1 and graphs.replays == 1  # one graph, replayed
    _assert_same_masks([first.masks], [kept], "first call's masks after the second replay")
