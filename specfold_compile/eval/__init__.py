"""Task-suite evaluation of vanilla / Spiffy / SpecFold decoding, the ``tau`` sweep, draft fidelity,
draft-graph calibration, and the committed GPU headline the demo prints.

``run``        the task-suite runner (``evaluate``: accuracy, NFE, tokens/s, accepted drafts and branches
               per call, recompute ratio per task and mode; docs/SPEC.md section 4)
``sweep``      per ``tau``: SpecFold accuracy, speed and recompute ratio, and draft fidelity
``fidelity``   folded vs dense logits at still-masked draft positions, against the copy-parent baseline
``calibrate``  the shipped model's draft graph from vanilla traces
``report``     versions, machine, JSON cleaning and the printed tables
``plot``       the sweep's figure (matplotlib)
``headline``   the committed GPU results' headline numbers (bench/results)

The command-line front ends (``specfold eval``, ``specfold sweep``) live in ``specfold_compile.cli``.
"""

from .calibrate import DEFAULT_DRAFT_GRAPH, calibrate_default
from .fidelity import FidelityRecorder, fidelity_positions, summarize_fidelity
from .report import MACHINE, format_sweep_table, format_table, versions
from .run import MODES, RESULT_KEYS, RunStats, compiled_model, decode_problems, evaluate, verify_graphs, warm_up
from .sweep import SWEEP_FIDELITY_COLUMNS, sweep, sweep_columns, write_sweep_csv

__all__ = [
    "evaluate", "sweep", "calibrate_default", "FidelityRecorder", "fidelity_positions", "summarize_fidelity",
    "DEFAULT_DRAFT_GRAPH", "MODES", "MACHINE", "RESULT_KEYS", "SWEEP_FIDELITY_COLUMNS", "sweep_columns",
    "write_sweep_csv", "format_table", "format_sweep_table", "versions", "compiled_model", "decode_problems",
    "warm_up", "verify_graphs", "RunStats",
]
