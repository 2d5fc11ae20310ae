"""How the backend reports what it does: Python logging, a TORCH_LOGS artifact, tlparse's structured trace,
and a progress line for long compiles.

* ``logging.getLogger("specfold_compile")``: the compile time of every graph (INFO) and why a graph runs
  unchanged (DEBUG). Registered with torch's logging as ``specfold``:
  ``torch._logging.set_logs(modules={"specfold": logging.INFO})`` (``set_logs`` takes the names of
  other libraries through ``modules``), or ``TORCH_LOGS="+specfold_compile"`` (torch parses
  ``TORCH_LOGS`` when it is imported, before this package can register a name, so the environment
  names the module).
* the ``specfold_graphs`` artifact: the graph after every pass (inserted nodes annotated), the region
  report and the fold decisions, at DEBUG: ``torch._logging.set_logs(modules={"specfold_graphs": True})``;
  it also follows ``TORCH_LOGS="+specfold_compile"``.
* ``TORCH_TRACE=<dir>`` (read by tlparse): the same graphs as ``graph_dump`` entries named
  ``specfold_NN_<step>``, the region report as the string artifact ``specfold_region_report`` and the
  graph's record as the JSON artifact ``specfold_graph_record``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Callable

import torch._logging
from torch._logging import _internal as torch_logging
from torch.fx import GraphModule

from ..passes.rewrite import annotation

log = logging.getLogger("specfold_compile")

GRAPHS_ARTIFACT = "specfold_graphs"
# A compile running longer than this prints one line to stderr (Inductor's lowering of a folded graph
# takes 20-45 s on the GPU; a silent wait that long looks like a hang).
PROGRESS_AFTER_S = 5.0

torch_logging.register_log("specfold", "specfold_compile")
torch_logging.register_artifact(GRAPHS_ARTIFACT, "specfold backend: the graph after every pass, the region "
                                "report and the fold decisions", visible=True)
graphs_log = torch._logging.getArtifactLogger("specfold_compile.backend", GRAPHS_ARTIFACT)


def annotated_code(gm: GraphModule) -> str:
    """The graph's code, then every node the passes inserted with its region and role."""
    inserted = [(n.name, annotation(n)) for n in gm.graph.nodes if annotation(n) is not None]
    lines = [gm.print_readable(print_output=False).rstrip()]
    if inserted:
        lines.append("\n# nodes inserted by specfold (node: region, role):")
        lines += [f"#   {name}: {a['region']}, {a['role']}" for name, a in inserted]
    return "\n".join(lines) + "\n"


def graph_step(index: int, step: str, gm: GraphModule) -> None:
    """Log the graph after ``step`` (the ``index``-th: 0 is the input graph) to the artifact and the trace."""
    if graphs_log.isEnabledFor(logging.DEBUG):
        graphs_log.debug("specfold graph after step %02d (%s):\n%s", index, step, annotated_code(gm))
    torch._logging.trace_structured("graph_dump", metadata_fn=lambda: {"name": f"specfold_{index:02d}_{step}"},
                                    payload_fn=lambda: annotated_code(gm))


def region_report(report: str) -> None:
    graphs_log.debug("%s", report)
    torch._logging.trace_structured("artifact", metadata_fn=lambda: {"name": "specfold_region_report",
                                                                     "encoding": "string"},
                                    payload_fn=lambda: report)


def graph_record(record: Any) -> None:
    """The compile time (INFO) and the record of one compiled graph (trace)."""
    log.info("specfold: compiled graph %s of %s in %.2f s (%s)", record.compile_id, record.function,
             record.compile_seconds, "folded" if record.folded else "not folded")
    torch._logging.trace_structured("artifact", metadata_fn=lambda: {"name": "specfold_graph_record",
                                                                     "encoding": "json"},
                                    payload_fn=lambda: _record_json(record))


def _record_json(record: Any) -> dict[str, Any]:
    return {"function": record.function, "compile_id": record.compile_id, "folded": record.folded,
            "skip_reason": record.skip_reason, "blockers": [str(b) for b in record.blockers],
            "fold_plan": record.fold_plan.description if record.fold_plan is not None else None,
            "regions": [str(r) for r in record.regions],
            "passes": [{"name": p.name, "ops_before": p.ops_before, "ops_after": p.ops_after,
                        "seconds": p.seconds} for p in record.passes],
            "compile_seconds": record.compile_seconds}


class CompileProgress:
    """One line on stderr for a compile that runs longer than ``PROGRESS_AFTER_S``: printed when the
    threshold passes (saying which step is running), or, where the compile ends first but took at least
    the threshold, at its end. ``step`` names what runs now."""

    def __init__(self, what: str, write: Callable[[str], Any] | None = None) -> None:
        self.what, self.step = what, "the passes"
        self._write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self._lock = threading.Lock()
        self._printed = False
        self._start = time.perf_counter()
        self._timer = threading.Timer(PROGRESS_AFTER_S, self._still_running)
        self._timer.daemon = True

    def __enter__(self) -> "CompileProgress":
        self._timer.start()
        return self

    def _print_once(self, line: str) -> None:
        with self._lock:
            if not self._printed:
                self._printed = True
                self._write(line)

    def _still_running(self) -> None:
        self._print_once(f"specfold: still compiling {self.what} after {PROGRESS_AFTER_S:g} s ({self.step})")

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self._start

    def __exit__(self, *exc: Any) -> None:
        self._timer.cancel()
        if exc[0] is None and self.seconds >= PROGRESS_AFTER_S:
            self._print_once(f"specfold: compiled {self.what} in {self.seconds:.1f} s")
