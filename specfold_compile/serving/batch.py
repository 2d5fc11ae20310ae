"""``generate`` over a list of prompts, built on the ``Engine``, and the package's ``generate``, which takes
one prompt (``decoding.generate``, unchanged) or a list of them.
"""

from __future__ import annotations

import torch

from .. import decoding
from ..decoding import DEFAULTS, GenerateResult
from .engine import Engine
from .request import RequestParams

__all__ = ["generate", "generate_batch"]

# generate's single-prompt options the batched path does not take, with the value it runs with
_SINGLE_ONLY = {"compile_writes": False, "all_logits": False, "specfold_options": None}


def generate(model, prompt_ids, *args, **kwargs):
    """``generate(model, prompt_ids, ...)``: one prompt (a 1-D int64 tensor) -> one ``GenerateResult``
    (``decoding.generate``, every option of it); a list (or tuple) of prompts -> a list of results in the
    same order, decoded together by an ``Engine`` (``generate_batch``), each request's tokens those of
    decoding it alone."""
    if isinstance(prompt_ids, (list, tuple)):
        return generate_batch(model, prompt_ids, *args, **kwargs)
    return decoding.generate(model, prompt_ids, *args, **kwargs)


def generate_batch(model, prompts, mode: str = "vanilla", max_new_tokens: int = DEFAULTS.max_new_tokens,
                   threshold: float = DEFAULTS.threshold, draft_budget: int = DEFAULTS.draft_budget,
                   draft_graph=None, stop_at_eos: bool = True, confidence_dtype: str = DEFAULTS.confidence_dtype,
                   max_requests: int | None = None, max_tokens_per_request: int | None = None,
                   tau: float | None = None, cuda_graphs=False, compile_layers: bool | str = False,
                   max_verify_rows: int | None = None, loop: str = "host", **single_only) -> list[GenerateResult]:
    """Decode every prompt of ``prompts`` (1-D int64 tensors) with the same options, batched: a list of
    ``GenerateResult`` in the prompts' order, each with the tokens, draft acceptances and forward count
    of ``decoding.generate`` on that prompt alone (``wall_time_s``: from the request's admission to its
    end). ``mode="specfold"`` folds at ``tau`` (needed: a number >= 0) in one batched folded forward a
    step (``folded.verify_batch_folded``).

    ``max_requests`` (default: every prompt at once) and ``max_tokens_per_request`` (default: what the
    longest request needs) size the ``Engine``'s pool; with fewer slots than prompts the rest wait and
    join as slots free up. ``cuda_graphs``, ``compile_layers``, ``max_verify_rows`` and ``loop`` are the
    ``Engine``'s (its passes replayed from CUDA graphs; its layers' position-wise pieces compiled; the rows
    a forward holds, drafts cut under load, ``Engine.rows_for``: the lossless modes' tokens stay the same,
    their forwards do not; each step's bookkeeping in Python or as tensor ops on the device, the same
    tokens). Every prompt is checked
    before anything runs: a bad one raises a one-line error naming its index (``prompt_ids[i]: ...``).
    Options of the single-prompt ``generate`` that the engine does not run (``compile_writes``,
    ``all_logits``, ``specfold_options``) are refused with a ``ValueError``.
    """
    for name, value in single_only.items():
        if name not in _SINGLE_ONLY:
            raise TypeError(f"generate() got an unexpected keyword argument {name!r}")
        if value != _SINGLE_ONLY[name]:
            raise ValueError(f"{name}: a list of prompts is decoded by the batched engine, which does not take "
                             f"{name}={value!r} yet (docs/serving.md); pass one prompt tensor for it")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompt_ids: expected a non-empty list of prompts")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, torch.Tensor):
            raise TypeError(f"prompt_ids[{i}]: expected a 1-D int64 tensor, got {type(prompt).__name__} (a list "
                            "of prompts holds one tensor a prompt)")
    params = RequestParams(max_new_tokens, threshold, draft_budget, stop_at_eos)
    if max_tokens_per_request is None:
        max_tokens_per_request = _positions_needed(model, prompts, max_new_tokens)
    engine = Engine(model, max_requests=len(prompts) if max_requests is None else max_requests,
                    max_tokens_per_request=max_tokens_per_request, mode=mode, draft_graph=draft_graph,
                    confidence_dtype=confidence_dtype, tau=tau, cuda_graphs=cuda_graphs,
                    compile_layers=compile_layers, max_verify_rows=max_verify_rows, loop=loop)
    ids = []
    for i, prompt in enumerate(prompts):
        try:
            ids.append(engine.add_request(prompt, params))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"prompt_ids[{i}]: {_without_name(str(exc))}") from None
    for _ in engine.run():
        pass
    results = []
    for i, request_id in enumerate(ids):
        out = engine.pop(request_id)
        if out.status != "finished":
            raise RuntimeError(f"prompt_ids[{i}]: the request {out.status}: {out.error}")
        results.append(out.result)
    return results


def _positions_needed(model, prompts, max_new_tokens) -> int:
    """The most cache positions any prompt's request needs (its prompt and every block but its last),
    within the model's position limit (a prompt that does not fit then fails with its own error)."""
    from ..decoding import layout_prompt

    cfg = model.config
    need = 0
    for prompt in prompts:
        if prompt.dim() == 1 and isinstance(max_new_tokens, int):
            layout = layout_prompt(prompt, int(cfg.block_size), cfg.decoding_rules.prompt_on_block_grid)
            need = max(need, layout.last_block_start(max_new_tokens))
    return min(need, int(cfg.max_position_embeddings))


def _without_name(message: str) -> str:
    return message.removeprefix("prompt_ids: ")
