"""``collect_stats()`` and ``fold_launched_calls()`` are per context: another thread's calls are not recorded,
and another thread's forcing does not reach this one."""

import threading

import torch

from specfold_compile.backend import collect_stats, dispatch, fold_launched_calls


def _gate_call():
    """One eager call of the gate op (what a folded graph runs once per layer), which reports to collectors."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 4, 8, generator=g)
    torch.ops.specfold.fold_gate(h, torch.tensor([-1, 0, 1]), torch.tensor(0.5), 0, True, "torch")


def _in_thread(fn):
    out, errors = [], []

    def run():
        try:
            out.append(fn())
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive() and not errors, errors
    return out[0]


def test_collectors_see_their_own_thread_only():
    def other_thread():
        with collect_stats() as mine:
            _gate_call()
            _gate_call()
        _gate_call()  # no collector in this thread
        return mine.calls

    with collect_stats() as s:
        assert _in_thread(other_thread) == 2  # ran while this thread's collector was active
        assert s.calls == 0, "another thread's calls were recorded here"
        _gate_call()
    assert s.calls == 1 and len(s.fold_masks) == 1


def test_fold_launched_calls_is_per_thread():
    plan = dispatch.FoldPlan(lambda n: True, "both", n_input=0, launched_plain=True)
    fd = dispatch.FoldDispatch(lambda x: "folded", lambda x: "plain", plan)
    rows = torch.zeros(3, 2)
    fd(rows)  # the first launched call at N = 3 warms the folded graph
    with fold_launched_calls():
        assert fd(rows) == "folded"
        assert _in_thread(lambda: fd(rows)) == "plain"
    assert fd(rows) == "plain"
