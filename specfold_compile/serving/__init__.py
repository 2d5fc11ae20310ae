"""Batched serving: several requests decoded together, their verification rows in one forward, each
request reading its own slot of a pooled prefix KV store (docs/serving.md).

Public API::

    Engine(model, max_requests=8, max_tokens_per_request=1024, mode="vanilla"|"spiffy"|"specfold",
           draft_graph=None, confidence_dtype=, max_waiting=None, tau=None, attention="auto",
           cuda_graphs=False | True | "eager" | BatchGraphs, fold_capacity=0.5,
           compile_layers=False | True | backend,  # True: Inductor on each layer's position-wise pieces
           max_verify_rows=None)  # R: the rows one verification forward holds, drafts cut under load
        .rows_for([decode, ...]) -> each ready request's rows of one step (drafts cut by max_verify_rows)
        .add_request(prompt_ids, RequestParams(...)) -> id   .step() -> [BlockOutput]   .run()
        .abort(id)   .output(id) -> RequestOutput   .pop(id)   .stats   .pool
        .new_decode(prompt_ids, params) -> RequestDecode   .submit(decode) -> id   # add_request's two halves
    RequestParams(max_new_tokens=, threshold=, draft_budget=, stop_at_eos=True)
    generate(model, prompt_ids | [prompt_ids, ...], ...)   # one prompt: decoding.generate; a list: batched
    KVPool(model, max_requests, max_tokens_per_request), PoolExhausted
    verify_batch_folded(model, pool, slots, rows, parents, logit_positions, tau)  # the folded forward
    BatchGraphs(model, max_requests, max_tokens_per_request, fold_capacity=0.5, min_packed=256,
                capacity_spread=4.0, compile_layers=False, gate_kernel=None,
                packed_attention=False)  # the passes' CUDA graphs, shareable
    capacity_from_masks([fold_masks, ...]) -> fold_capacity a gate, from earlier requests' fold masks
"""

from .batch import generate, generate_batch
from .engine import SERVING_MODES, Engine
from .outputs import BlockOutput, EngineStats, RequestOutput
from .folded import verify_batch_folded
from .graphs import BatchGraphs, capacity_from_masks
from .pool import KVPool, PoolExhausted
from .request import RequestParams

__all__ = ["Engine", "RequestParams", "BlockOutput", "RequestOutput", "EngineStats", "SERVING_MODES",
           "generate", "generate_batch", "KVPool", "PoolExhausted", "verify_batch_folded", "BatchGraphs",
           "capacity_from_masks"]
