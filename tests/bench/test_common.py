import pytest

from bench.common import time_launched


def test_time_launched_is_the_median_of_waited_calls(monkeypatch):
    """Warm-up calls are not timed; the result is the median of the timed calls' wall times."""
    clock = iter([0.0, 0.001, 1.0, 1.009, 2.0, 2.002])  # perf_counter pairs: 1, 9 and 2 ms (mean 4)
    monkeypatch.setattr("bench.common.time.perf_counter", lambda: next(clock))
    calls = []
    assert time_launched(lambda: calls.append(1), calls=3, warmup=2) == pytest.approx(2.0)
    assert len(calls) == 5
