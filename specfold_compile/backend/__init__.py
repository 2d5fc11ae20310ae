"""The ``specfold`` torch.compile backend.

Registered through the ``torch_dynamo_backends`` entry point (pyproject.toml), so
``torch.compile(model, backend="specfold", options={...})`` works without importing this package;
``torch.compile(model, backend=SpecFoldBackend(**options))`` validates the options up front and keeps a
record of every graph it compiles. What it does is logged (``backend/logs.py``) and, with ``dump_dir``,
written out graph by graph (``backend/dumps.py``).
"""

from __future__ import annotations

import importlib.metadata
from typing import Any, Callable

import torch
from torch.fx import GraphModule

from ..ops.fold_ops import invalid_parents_seen
from .compile import Rewrite, compile_graph, compile_with_record, run_passes
from .dispatch import fold_launched_calls
from .records import GraphRecord, PassRecord, RegionRecord, SpecFoldError, region_report
from .recompile_limit import RecompileLimitError
from .settings import SpecFoldSettings, Tuning
from ..ops.stats import FoldStats, collect_stats

__all__ = ["specfold_backend", "SpecFoldBackend", "GraphRecord", "PassRecord", "RegionRecord", "Rewrite",
           "compile_graph", "run_passes", "region_report", "SpecFoldSettings", "Tuning", "SpecFoldError",
           "RecompileLimitError", "collect_stats", "FoldStats", "fold_launched_calls", "invalid_parents_seen"]


def specfold_backend(gm: GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None,
                     mode: str | None = None, **unused: Any) -> Callable:
    """torch.compile backend entry point (``backend="specfold"``, ``options={...}``)."""
    return compile_with_record(gm, example_inputs, SpecFoldSettings.from_options(options))[0]


class SpecFoldBackend:
    """The backend as an object: ``torch.compile(model, backend=SpecFoldBackend(tau=0.1, ...))``.

    Takes the options of ``SpecFoldSettings`` as keyword arguments and validates them here, at
    construction (an unknown name or a bad value is a one-line error naming the option), not at the first
    compile inside Dynamo. ``graphs`` lists a ``GraphRecord`` per graph compiled (regions, blockers,
    fold plan, op counts per pass, compile time; ``print(record)`` reads well). Reuse one object for one
    set of options: Dynamo keeps a model's graphs per backend object, so a new object per call compiles
    again. ``backend="specfold"`` with ``options={...}`` compiles the same way.
    """

    def __init__(self, **options: Any) -> None:
        self.settings = SpecFoldSettings.from_options(options)
        self.graphs: list[GraphRecord] = []

    def __call__(self, gm: GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
        if kwargs:
            raise TypeError(f"SpecFoldBackend: options go to SpecFoldBackend(...), not torch.compile; got "
                            f"{sorted(kwargs)}")
        compiled, record = compile_with_record(gm, example_inputs, self.settings)
        self.graphs.append(record)
        return compiled

    def __repr__(self) -> str:
        return f"SpecFoldBackend({self.settings}, {len(self.graphs)} graph(s) compiled)"


# backend="specfold" without an installed package (a source checkout on PYTHONPATH, as on the GPU
# machine): the entry point in pyproject.toml registers the name only for installed copies. Where the
# entry point exists, leave the name to it: a lookup of "specfold" loads this module and then registers
# the name itself, which a registration here would make a duplicate. (Reading the entry points is what
# Dynamo does too; torch._dynamo.list_backends would import every Dynamo backend, ~1 s.)
if "specfold" not in importlib.metadata.entry_points(group="torch_dynamo_backends").names:
    try:
        torch._dynamo.register_backend(specfold_backend, name="specfold")
    except AssertionError:  # registered already in this process (the module executed again)
        pass
