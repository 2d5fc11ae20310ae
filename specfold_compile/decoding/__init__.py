"""Greedy block-diffusion decoding: vanilla and Spiffy (lossless draft-graph speculation).

Public API::

    generate(model, prompt_ids, mode="vanilla"|"spiffy", max_new_tokens=128, threshold=0.9,
             draft_budget=8, draft_graph=None, stop_at_eos=True, cuda_graphs=False) -> GenerateResult
    VerifyGraphs(model, replay="cuda"|"eager")  # CUDA-graph verification calls, kept across prompts
    load_draft_graph(path_or_dict, block_size) -> DraftGraph
    save_draft_graph(graph, path)
    default_draft_graph(block_size) -> dict
    record_traces(model, prompts, max_new_tokens=128, threshold=0.9) -> dict
    calibrate(traces, size=12, max_level=4, max_rank=None) -> dict
    calibrate_cli(argv) -> int
    DEFAULTS  # max_new_tokens, draft_budget, threshold, confidence_dtype of the command line
"""

from .calibration import calibrate, calibrate_cli, count_rank_sets
from .commit import block_finished, commit, confidence, rank_masked_positions, window_positions
from .cuda_graphs import VerifyGraphs, logit_rows_bucket
from .decoder import MODES, GenerateResult, StepStats, generate, mark_dynamic_shapes, record_traces
from .defaults import DEFAULTS, DecodingDefaults
from .graph import DraftGraph, build_drafts, default_draft_graph, load_draft_graph, prune_nodes, save_draft_graph

__all__ = [
    "generate", "GenerateResult", "VerifyGraphs", "logit_rows_bucket", "StepStats", "MODES", "record_traces",
    "mark_dynamic_shapes", "DEFAULTS", "DecodingDefaults",
    "calibrate", "calibrate_cli", "count_rank_sets",
    "DraftGraph", "load_draft_graph", "save_draft_graph", "default_draft_graph", "build_drafts", "prune_nodes",
    "commit", "confidence", "window_positions", "rank_masked_positions", "block_finished",
]
