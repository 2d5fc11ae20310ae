"""One request's decode, stepped by the engine: the bookkeeping of ``decoding.generate``'s host loop
(``decoder._decode``), cut at its forwards so that the engine can run the forwards of many requests
together.

A ``RequestDecode`` walks the same states as the batch-1 loop: ``start_block`` (the block's fixed prompt
tokens, or the seed from the previous write's logits), then ``rows`` (the main state and, under Spiffy,
its drafts: ``decoding.build_drafts``) and ``accept`` (the commit rule and Spiffy's acceptance walk on
that call's confidences) until ``block_done``, then ``end_block`` (the block's output tokens; the engine
writes the block to the request's pool slot unless the request is done). Given the same logits it
commits the same tokens, accepts the same drafts and counts the same forwards as ``generate`` on the
request alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..decoding import DEFAULTS, GenerateResult, StepStats, build_drafts, layout_prompt
from ..decoding.commit import block_finished, next_token
from ..decoding.decoder import _Scoring, _validate, commit_and_accept
from ..decoding.device_step import STATUS_FIELDS

__all__ = ["RequestParams", "RequestDecode", "seed_tokens"]


def seed_tokens(next_logits: torch.Tensor, mask_id: int) -> list[int]:
    """The position-0 token of each next block from its logits ``[n, V]`` (a prefill's or block write's
    ``next_logits``): the argmax with the mask excluded, as ``generate`` seeds a block; one host read."""
    return next_token(next_logits, mask_id).tolist()


@dataclass(frozen=True)
class RequestParams:
    """What one request decodes with (``generate``'s arguments of the same names and defaults)."""

    max_new_tokens: int = DEFAULTS.max_new_tokens
    threshold: float = DEFAULTS.threshold
    draft_budget: int = DEFAULTS.draft_budget
    stop_at_eos: bool = True


class RequestDecode:
    """The decode state of one request (module docstring). ``slot``: its pool slot while it runs."""

    def __init__(self, request_id: int, prompt_ids: torch.Tensor, params: RequestParams, model, mode: str,
                 graph, confidence_dtype: str):
        if not isinstance(params, RequestParams):
            raise TypeError(f"params: expected a RequestParams or None, got {type(params).__name__}")
        _validate(prompt_ids, mode, params.max_new_tokens, params.threshold, params.draft_budget,
                  params.stop_at_eos, confidence_dtype=confidence_dtype)
        cfg = model.config
        vocab = int(cfg.vocab_size)
        if int(prompt_ids.min()) < 0 or int(prompt_ids.max()) >= vocab:
            raise ValueError(f"prompt_ids: ids must lie in [0, {vocab})")
        self.block, self.mask_id = int(cfg.block_size), int(cfg.mask_token_id)
        sub_block = None if cfg.sub_block_size is None else int(cfg.sub_block_size)
        rules = cfg.decoding_rules
        self.layout = layout_prompt(prompt_ids.cpu(), self.block, rules.prompt_on_block_grid)
        self.layout.check_positions(params.max_new_tokens, int(cfg.max_position_embeddings))
        self.prompt_tokens = int(prompt_ids.numel())
        self.scoring = _Scoring(self.mask_id, sub_block, float(params.threshold), confidence_dtype,
                                rules.argmax_of_probs, rules.threshold_inclusive)
        self.request_id, self.params, self.mode, self.graph = request_id, params, mode, graph
        self.eos = int(cfg.eos_token_id) if params.stop_at_eos else None
        self.spiffy = mode != "vanilla" and params.draft_budget > 0 and graph is not None and len(graph) > 0
        self.head = list(self.layout.head)
        self.out: list[int] = []
        self.steps: list[StepStats] = []
        self.nfe = 0
        self.blocks = 0
        self.done = False
        self.slot: int | None = None
        self.t0 = 0.0
        self.state = None                  # the current block's main state X, int64 [B] on the CPU
        self.prev = None                   # (conf, tok) of the logits that produced X
        self._rows = None                  # the rows and parents of the call in flight
        self.start = self.need = 0

    @property
    def cache_positions(self) -> int:
        """Prefix positions this request's slot may come to hold (its last block is never written)."""
        return self.layout.last_block_start(self.params.max_new_tokens)

    # --- a block ----------------------------------------------------------------------------------
    def begin(self) -> None:
        """The request starts running (its prefill follows): the clock of its ``wall_time_s``."""
        self.t0 = time.perf_counter()
        self.nfe = 1 if self.layout.prefill_ids.numel() else 0

    def start_block(self, seed: int | None) -> None:
        """Open the next block: the prompt's fixed tail, or position 0 the ``seed`` token (``seed_tokens``
        of the prefill's or the last block write's next-block logits)."""
        self.blocks += 1
        self.start = len(self.head)
        self.need = min(self.block - self.start, self.params.max_new_tokens - len(self.out))
        state = torch.full((self.block,), self.mask_id, dtype=torch.long)
        state[:self.start] = torch.tensor(self.head, dtype=torch.long)
        if not self.head:
            if seed is None:
                raise ValueError("seed: a block that opens without prompt tokens needs the seed token")
            state[0] = int(seed)
        self.head = []
        self.state, self.prev = state, None

    def _finished(self, state) -> bool:
        return block_finished(state, self.mask_id, self.need, self.eos, self.start)

    def block_done(self) -> bool:
        return self._finished(self.state)

    # --- a verification call ----------------------------------------------------------------------
    def rows(self, draft_budget: int | None = None) -> torch.Tensor:
        """The rows of this request's next verification call (int64 [N, B], row 0 the main state), with at
        most ``draft_budget`` drafts if given (the engine's share under load) and ``params.draft_budget``."""
        budget = self.params.draft_budget if draft_budget is None else min(draft_budget, self.params.draft_budget)
        if self.spiffy and self.prev is not None:
            drafts = build_drafts(self.state, self.prev[0], self.prev[1], self.graph, self.mask_id,
                                  self.scoring.sub_block_size, budget, self._finished)
            rows, parents = torch.stack([self.state] + drafts.states), [-1] + drafts.parents
        else:
            rows, parents = self.state.unsqueeze(0), [-1]
        self._rows = (rows, parents)
        return rows

    @property
    def parents(self) -> torch.Tensor:
        """The parents of the rows of the call in flight (int64 [N]: -1, then each draft's parent row)."""
        return torch.tensor(self._rows[1], dtype=torch.long)

    def forced_fold_masks(self) -> torch.Tensor | None:
        """The fold masks to force on the call in flight (bool [G, N, B], SPEC P4), or None: gated. The
        engine forces a forward's masks when every request in it has some (a trace-driven benchmark
        replaying recorded masks); a request's own decode never does."""
        return None

    def logit_positions(self, rows: torch.Tensor) -> torch.Tensor:
        """The flat positions whose logits the call needs: the masked ones (``generate``'s default)."""
        return (rows == self.mask_id).flatten().nonzero().flatten()

    def accept(self, conf_masked: torch.Tensor, tok_masked: torch.Tensor) -> None:
        """Take the call's confidences at the masked positions (CPU, in ``logit_positions`` order): commit
        the main state, walk the accepted drafts, record the call."""
        rows, parents = self._rows
        self._rows = None
        masked = self.logit_positions(rows)
        conf = torch.zeros(rows.numel(), dtype=conf_masked.dtype)
        tok = torch.full((rows.numel(),), self.mask_id, dtype=torch.long)
        conf[masked], tok[masked] = conf_masked, tok_masked
        conf, tok = conf.view(rows.shape), tok.view(rows.shape)
        self.nfe += 1
        state, accepted, cur = commit_and_accept(self.scoring, self.state, rows, conf, tok, self._finished)
        self.steps.append(StepStats(branches=rows.shape[0], accepted=accepted, parents=parents, rows=rows))
        if torch.equal(self.state, state):  # cannot happen: every step commits >= 1 non-mask token
            raise RuntimeError("decoding made no progress (non-finite logits?)")
        self.state, self.prev = state, (conf[cur], tok[cur])

    def took_step(self, status: list[int], state: torch.Tensor) -> None:
        """Record a call whose bookkeeping ran on the device (``Engine(loop="device")``,
        ``device_steps``): its status word (``STATUS_FIELDS``, then the call's parents) and the new main
        state (int64 [B], host), as ``accept`` records a call."""
        _, accepted, stalled, rows = status[:4]
        self.nfe += 1
        self.steps.append(StepStats(branches=rows, accepted=accepted, parents=status[len(STATUS_FIELDS):]))
        if stalled:
            raise RuntimeError("decoding made no progress (non-finite logits?)")
        self.state, self.prev = state, None

    def end_block(self) -> list[int]:
        """The finished block's output tokens (cut after an eos); sets ``done`` when the request has all
        its tokens or stopped at an eos."""
        blk = self.state[self.start:self.start + self.need].tolist()
        if self.eos is not None and self.eos in blk:
            blk = blk[: blk.index(self.eos) + 1]
            self.done = True
        self.out.extend(blk)
        if len(self.out) >= self.params.max_new_tokens:
            self.done = True
        return blk

    def result(self) -> GenerateResult:
        return GenerateResult(tokens=list(self.out), nfe=self.nfe, wall_time_s=time.perf_counter() - self.t0,
                              steps=self.steps, mode=self.mode, blocks=self.blocks)
