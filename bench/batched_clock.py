"""Where a ``bench.batched`` run's wall time goes, with graphs: the time spent inside the engine's
replayed passes (``BatchGraphs.verify``; ``BatchGraphs.write`` for finished blocks; the batched prefills,
``Engine._prefill_replayed``, whose own writes count there), each from the host's view (input building,
the replay and the read of its results, which waits for the GPU; a write read later,
``BatchGraphs.write(read=False)``, counts that read too), and the rest (``host_s``): the engine's and the
forcing's bookkeeping on the host (the rows it builds while a write runs included). A pass's results are
read before the next pass starts, so the passes do not overlap and the parts add up to the wall time
(not so under ``Engine(loop="device")``, which reads a replayed forward's results after its bookkeeping:
such a run is not split). And when the requests arrive (``arrival_times``), the latency percentiles
(``percentile``) and the garbage collector's pauses during a run (``GcClock``)."""

from __future__ import annotations

import gc
import random
import time

PARTS = ("verify_s", "write_s", "prefill_s", "host_s")


class PassClock:
    """Times one engine's replayed passes (``engine.graphs`` set) until ``close()``; ``parts(wall)`` gives
    ``PARTS`` for a run of ``wall`` seconds."""

    def __init__(self, engine):
        self.engine, self.totals = engine, dict.fromkeys(PARTS[:3], 0.0)
        self._prefilling = False
        graphs = engine.graphs
        graphs.verify = self._timed(graphs.verify, "verify_s")
        graphs.write = self._timed(graphs.write, "write_s")
        engine._prefill_replayed = self._timed(engine._prefill_replayed, "prefill_s")

    def _timed(self, fn, part):
        def timed(*args, **kwargs):
            if self._prefilling:  # a prefill's own write: counted in prefill_s
                return fn(*args, **kwargs)
            self._prefilling = part == "prefill_s"
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:
                self.totals[part] += time.perf_counter() - t0
                self._prefilling = False
            # a write not waited for (``read=False``) returns its read, which waits for it: timed there too
            return self._timed(out, part) if callable(out) else out
        return timed

    def close(self) -> None:
        """The wrappers gone: the classes' own methods show again (the graphs serve later engines)."""
        del self.engine.graphs.verify, self.engine.graphs.write, self.engine._prefill_replayed

    def parts(self, wall: float) -> dict:
        out = dict(self.totals)
        out["host_s"] = wall - sum(out.values())
        return out


class GcClock:
    """The garbage collector's pauses from its creation until ``read()``: ``gc_s`` in all,
    ``gc_collections``, and ``gc_full`` of them full (generation 2, which walk every tracked object: the
    longest after many compiles). A part of ``host_s`` that is not the engine's own work."""

    def __init__(self):
        self.gc_s, self.collections, self.full, self._since = 0.0, 0, 0, None
        gc.callbacks.append(self._collecting)

    def _collecting(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._since = time.perf_counter()
        elif self._since is not None:
            self.gc_s += time.perf_counter() - self._since
            self.collections += 1
            self.full += info.get("generation") == 2
            self._since = None

    def read(self) -> dict:
        """The totals so far; the callback removed."""
        if self._collecting in gc.callbacks:
            gc.callbacks.remove(self._collecting)
        return {"gc_s": self.gc_s, "gc_collections": self.collections, "gc_full": self.full}


def arrival_times(n: int, args) -> list[float]:
    """Each of ``n`` requests' arrival (s from the start): all at once (``--arrival closed``), or Poisson at
    ``args.rate`` a second (seed 0)."""
    if args.arrival == "closed":
        return [0.0] * n
    gen, t, out = random.Random(0), 0.0, []
    for _ in range(n):
        out.append(t)
        t += gen.expovariate(args.rate)
    return out


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between the closest ranks."""
    xs = sorted(values)
    at = (len(xs) - 1) * q / 100
    lo = int(at)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (at - lo)
