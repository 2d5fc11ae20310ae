"""Greedy block-diffusion decoding: vanilla, Spiffy (lossless draft-graph speculation) and SpecFold
(Spiffy through the ``specfold``-compiled verification forward).

Public API::

    DEFAULTS  # max_new_tokens, draft_budget, threshold, confidence_dtype: what generate uses
    generate(model, prompt_ids, mode="vanilla"|"spiffy"|"specfold", max_new_tokens=, threshold=,
             draft_budget=, draft_graph=None, stop_at_eos=True, cuda_graphs=False, confidence_dtype=,
             tau=None, specfold_options=None) -> GenerateResult
    specfold_forward(model, tau=None, options=None)  # the compiled forward mode="specfold" verifies with
    VerifyGraphs(model, replay="cuda"|"eager", forward=None)  # CUDA-graph verification calls, kept across prompts
    load_draft_graph(path_or_dict, block_size) -> DraftGraph
    save_draft_graph(graph, path)
    default_draft_graph(block_size) -> dict
    record_traces(model, prompts, max_new_tokens=, threshold=, confidence_dtype=) -> dict
    calibrate(traces, size=12, max_level=4, max_rank=None) -> dict
    calibrate_cli(argv) -> int
"""

from .calibration import calibrate, calibrate_cli, count_rank_sets
from .commit import block_finished, commit, confidence, rank_masked_positions, window_positions
from .cuda_graphs import VerifyGraphs, logit_rows_bucket
from .defaults import CONFIDENCE_DTYPES, DEFAULTS, DecodingDefaults
from .decoder import MODES, GenerateResult, StepStats, generate, mark_dynamic_shapes, record_traces
from .graph import DraftGraph, build_drafts, default_draft_graph, load_draft_graph, prune_nodes, save_draft_graph
from .prompt_layout import PromptLayout, layout_prompt
from .specfold import specfold_forward

__all__ = [
    "DEFAULTS", "DecodingDefaults", "CONFIDENCE_DTYPES", "PromptLayout", "layout_prompt",
    "generate", "GenerateResult", "VerifyGraphs", "logit_rows_bucket", "StepStats", "MODES", "record_traces",
    "mark_dynamic_shapes", "specfold_forward",
    "calibrate", "calibrate_cli", "count_rank_sets",
    "DraftGraph", "load_draft_graph", "save_draft_graph", "default_draft_graph", "build_drafts", "prune_nodes",
    "commit", "confidence", "window_positions", "rank_masked_positions", "block_finished",
]
