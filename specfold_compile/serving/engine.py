"""The serving engine: continuous batching of block-diffusion decodes over one model and one KV pool.

``Engine(model, max_requests, max_tokens_per_request, mode)`` keeps a queue of waiting requests and a set
of running ones, each running request in its own pool slot. One ``step()``:

1. admits waiting requests while slots are free (each one's prompt prefilled alone into its slot; with
   ``cuda_graphs``, all of them together as block writes of their prompts' chunks: ``_prefill_replayed``);
2. runs ONE verification forward over the rows (main and, under Spiffy or SpecFold, drafts) of every
   running request whose block still has masks (``forward.verify_batch``; SpecFold: the folded forward
   ``folded.verify_batch_folded``, each draft folding against its parent within its own request), and
   applies each request's commit rule and acceptance walk to its own rows' confidences;
3. hands out every block that is now finished (``step``'s return value, ``BlockOutput``), lets the
   requests that are done leave (their slot freed at once), and writes the other finished blocks to
   their slots in one batched pass (``forward.write_blocks``); their next block starts.

Requests join whenever a slot is free (their first block starts at their own block boundary) and leave
as soon as they are done, so a long request never holds up a short one. Each request decodes the tokens,
draft acceptances and forwards of ``generate`` on that request alone (``request.RequestDecode``), unless
``max_verify_rows`` cuts its drafts under load (``Engine.rows_for``).
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Iterator

import torch

from ..decoding import DEFAULTS, load_draft_graph
from ..decoding.commit import confidence
from ..decoding.graph import default_graph
from ..reference import gate_count
from .compiled import check_compile_layers, compiled_model
from .device_steps import SlotSteps, share_drafts
from .engine_args import SERVING_MODES, check_engine_args
from .folded import verify_batch_folded
from .forward import check_serving_model, engine_attention, verify_batch, write_blocks
from .graphs import BatchGraphs, check_cuda_graphs, check_fold_capacity, shared_graphs
from .outputs import BlockOutput, EngineStats, RequestOutput
from .pool import KVPool, PoolExhausted
from .request import RequestDecode, RequestParams, seed_tokens

__all__ = ["Engine", "SERVING_MODES"]

class Engine:
    """Continuous batching over ``model`` (a ``BlockDiffusionLM``): module docstring.

    ``max_requests``: pool slots (requests running at once); ``max_tokens_per_request``: prefix positions
    a slot holds (a request needs its prompt plus every block but its last: ``add_request`` refuses one
    that does not fit). ``mode``: ``"vanilla"``, ``"spiffy"`` or ``"specfold"`` (both with ``draft_graph``:
    a path, dict or ``DraftGraph``, None the default graph). ``tau``: SpecFold's fold threshold (a number
    >= 0, 0 folds nothing; needed by ``"specfold"`` and taken by no other mode). ``confidence_dtype``: as
    in ``generate``. ``max_waiting``: how many requests may queue for a slot (None: any number);
    ``add_request`` raises ``PoolExhausted`` beyond it. ``attention``: how the batched passes attend,
    ``"per_request"`` or ``"ragged"`` (``forward``'s module docstring); ``"auto"`` takes ``"ragged"`` on
    CUDA and ``"per_request"`` elsewhere (``forward.engine_attention``). ``cuda_graphs``: False launches
    every pass; True replays the verification forwards, block writes and prefills from CUDA graphs bucketed by
    rows (``graphs.BatchGraphs``, over ragged attention: ``attention`` must be ``"auto"`` or
    ``"ragged"``); ``"eager"`` the same bookkeeping with the passes called again (the CPU path); or a
    ``BatchGraphs`` to share its pool and graphs between engines of one model (at most its slots, its
    ``max_tokens_per_request``). ``fold_capacity``: with graphs under SpecFold, the share of the draft
    rows' positions a gate is expected to compute, one number or one a gate, which its graphs pack with
    a margin (``graphs``' module docstring, ``graphs.capacity_from_masks``; a forward that computes more
    is replayed again at a larger capacity, ``stats.overflows``); a shared ``BatchGraphs`` keeps its own
    (and its ``gate``, ``min_packed``, ``capacity_spread``). ``max_verify_rows``: None (default), or the
    rows (mains and drafts) one verification forward may hold, an int >= 1 (``rows_for``). ``loop``:
    ``"host"`` (default) runs each request's commits, acceptance walk and drafts in Python;
    ``"device"`` runs them for every request of a step at once as tensor ops on the model's device
    (``device_steps``: the same tokens and forwards), replayed from CUDA graphs too with ``cuda_graphs``;
    there ``max_verify_rows`` cuts the drafts the step built (``SlotSteps.keep_drafts``).
    ``compile_step``: under ``loop="device"``, that bookkeeping through ``torch.compile`` (True:
    Inductor, or a backend's name; None, the default: on CUDA), on shapes padded as the graphs pad them,
    so that each kind of decode and request bucket compiles once; a failed compile runs the same ops
    eagerly (``device_steps.compile_error``)."""

    def __init__(self, model, max_requests: int = 8, max_tokens_per_request: int = 1024, mode: str = "vanilla",
                 draft_graph=None, confidence_dtype: str = DEFAULTS.confidence_dtype, max_waiting: int | None = None,
                 tau: float | None = None, attention: str = "auto", cuda_graphs=False,
                 fold_capacity: float | tuple[float, ...] = 0.5, compile_layers: bool | str = False,
                 max_verify_rows: int | None = None, loop: str = "host", compile_step: bool | str | None = None):
        check_serving_model(model)
        tau = check_engine_args(mode, tau, confidence_dtype, max_waiting, max_verify_rows, loop, compile_step)
        self.max_verify_rows = max_verify_rows
        backend = check_compile_layers(compile_layers)
        self.device = model.embed_tokens.weight.device
        graphs = check_cuda_graphs(cuda_graphs, attention)
        check_fold_capacity(fold_capacity)
        self.attention = engine_attention("ragged" if graphs else attention, self.device)
        block = int(model.config.block_size)
        self.graph = None
        if mode != "vanilla":
            self.graph = default_graph(block) if draft_graph is None else load_draft_graph(draft_graph, block)
        elif draft_graph is not None:
            load_draft_graph(draft_graph, block)  # still reject a malformed graph
        self.mode, self.confidence_dtype, self.max_waiting = mode, confidence_dtype, max_waiting
        self.tau = tau
        self.max_requests = max_requests
        if isinstance(cuda_graphs, BatchGraphs):
            self.graphs = shared_graphs(cuda_graphs, model, max_requests, max_tokens_per_request, backend)
        elif graphs:
            self.graphs = BatchGraphs(model, max_requests, max_tokens_per_request,
                                      "cuda" if cuda_graphs is True else "eager", fold_capacity,
                                      compile_layers=compile_layers)
        else:
            self.graphs = None
        # what the passes run: the model, or its view with the layers compiled (compiled.ModelView)
        self.model = compiled_model(model, backend) if self.graphs is None else self.graphs.model
        self.pool = KVPool(model, max_requests, max_tokens_per_request) if self.graphs is None else self.graphs.pool
        self.device_steps = None if loop == "host" else SlotSteps.for_engine(max_requests, block, self.device,
                                                                              self.graph, self.graphs, compile_step)
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._waiting: deque[RequestDecode] = deque()
        self._running: list[RequestDecode] = []
        self._outputs: dict[int, RequestOutput] = {}
        self._ahead: dict[RequestDecode, torch.Tensor] = {}  # rows built during a block write (_rows_ahead)
        # switch: False builds every row after the block write's seeds are read (to bisect or measure it)
        self.rows_ahead = True

    # --- requests ---------------------------------------------------------------------------------
    def add_request(self, prompt_ids: torch.Tensor, params: RequestParams | None = None) -> int:
        """Queue a request (``prompt_ids``: 1-D int64 token ids); returns its id. A request that cannot run
        (a bad prompt or parameter, or more cache positions than ``max_tokens_per_request``) is refused here
        with a one-line error naming the argument, and nothing else changes."""
        return self.submit(self.new_decode(prompt_ids, RequestParams() if params is None else params))

    def new_decode(self, prompt_ids: torch.Tensor, params: RequestParams) -> RequestDecode:
        """The decode state ``add_request`` queues for a prompt (checked, not queued): this engine's model,
        mode, draft graph and confidence dtype."""
        return RequestDecode(-1, prompt_ids, params, self.model, self.mode, self.graph, self.confidence_dtype)

    def submit(self, decode: RequestDecode) -> int:
        """Queue a decode state made by ``new_decode`` (``add_request`` is ``submit(new_decode(...))``; a
        benchmark may subclass the state first, e.g. to force recorded steps: ``bench/batched.py``);
        returns its request id."""
        if decode.cache_positions > self.pool.capacity:
            raise ValueError(f"prompt_ids: a prompt of {decode.prompt_tokens} tokens with max_new_tokens="
                             f"{decode.params.max_new_tokens} needs {decode.cache_positions} cache positions, "
                             f"beyond max_tokens_per_request={self.pool.capacity}")
        if len(self._waiting) + len(self._running) >= self.max_requests + (
                float("inf") if self.max_waiting is None else self.max_waiting):
            raise PoolExhausted(f"pool exhausted: all max_requests={self.max_requests} slots hold a request "
                                f"and max_waiting={self.max_waiting} requests wait; step until some finish, or "
                                "abort some")
        decode.request_id = request_id = next(self._ids)
        self._waiting.append(decode)
        self._outputs[request_id] = RequestOutput(request_id, "waiting")
        return request_id

    def abort(self, request_id: int) -> bool:
        """Stop a waiting or running request (its slot freed at once); False if it had already ended."""
        out = self._output(request_id)
        if out.status not in ("waiting", "running"):
            return False
        for queue in (self._waiting, self._running):
            for decode in list(queue):
                if decode.request_id == request_id:
                    queue.remove(decode)
                    if decode.slot is not None:
                        self.pool.free(decode.slot)
        out.status = "aborted"
        return True

    def output(self, request_id: int) -> RequestOutput:
        """The record of a request: its status, blocks so far and, once finished, its result."""
        return self._output(request_id)

    def pop(self, request_id: int) -> RequestOutput:
        """The record of a request that has ended, forgotten by the engine."""
        out = self._output(request_id)
        if out.status in ("waiting", "running"):
            raise ValueError(f"request_id: request {request_id} is still {out.status}; abort it first")
        return self._outputs.pop(request_id)

    def _output(self, request_id: int) -> RequestOutput:
        if request_id not in self._outputs:
            raise ValueError(f"request_id: no request {request_id!r} in this engine")
        return self._outputs[request_id]

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    # --- stepping ---------------------------------------------------------------------------------
    def run(self) -> Iterator[BlockOutput]:
        """Step until no request waits or runs, yielding every finished block as it comes."""
        while self.has_work:
            yield from self.step()

    @torch.inference_mode()
    def step(self) -> list[BlockOutput]:
        """One engine step (module docstring); returns the blocks it finished, in request order."""
        events: list[BlockOutput] = []
        self._admit(events)
        ready = [d for d in self._running if not d.block_done()]
        if ready:
            self._verify(ready, events)
        self._settle(events)
        return events

    def _admit(self, events: list[BlockOutput]) -> None:
        admitted = []
        while self._waiting and self.pool.free_slots and len(self._running) + len(admitted) < self.max_requests:
            decode = self._waiting.popleft()
            decode.slot = self.pool.allocate()
            decode.begin()
            admitted.append(decode)
        seeds = self._prefill_replayed(admitted) if self.graphs is not None else {}
        for decode in admitted:
            try:
                if decode in seeds:
                    self.stats.prefills += 1
                    decode.start_block(seeds[decode])
                elif decode.layout.prefill_ids.numel():  # a launched prefill: only it needs the ids on the device
                    cache = self.model.prefill(decode.layout.prefill_ids.to(self.device),
                                               block_causal=decode.layout.block_causal)
                    self.pool.load(decode.slot, cache.keys, cache.values)
                    self.stats.prefills += 1
                    decode.start_block(seed_tokens(cache.next_logits[None], decode.mask_id)[0])
                else:
                    decode.start_block(None)
            except Exception as exc:  # this request fails alone; the others run on
                self._fail(decode, exc, events)
                continue
            self._running.append(decode)
            self._outputs[decode.request_id].status = "running"

    def _prefill_replayed(self, admitted: list[RequestDecode]) -> dict[RequestDecode, int]:
        """The prefills of the requests just admitted, batched and replayed: a prefill is the block
        write of its prompt's chunks of ``block_size`` in turn (the same mask: NLD's causal prefill as
        causal writes, Fast-dLLM v2's block-causal one as bidirectional block writes on the block grid),
        so round ``j`` writes every request's chunk ``j`` through ``BatchGraphs.write`` (grouped by chunk
        length). Returns each prefilled request's seed token; a request whose layout's mask is not its
        writes', or any request of a round that raises, is left to the launched prefill (which loads its
        slot from the start)."""
        writes_causal = self.model.config.family == "nld"
        block = int(self.model.config.block_size)
        chunks = {d: list(d.layout.prefill_ids.split(block)) for d in admitted
                  if d.layout.prefill_ids.numel() and d.layout.block_causal != writes_causal}
        seeds: dict[RequestDecode, int] = {}
        try:
            for j in range(max((len(c) for c in chunks.values()), default=0)):
                groups: dict[int, list[RequestDecode]] = {}
                for d, c in chunks.items():
                    if j < len(c):
                        groups.setdefault(int(c[j].numel()), []).append(d)
                for group in groups.values():
                    written = self.graphs.write([d.slot for d in group], [chunks[d][j] for d in group])
                    seeds.update(zip(group, written))
        except Exception:  # each request then prefills alone and, if it fails, fails alone
            return {}
        return seeds

    def _fail(self, decode: RequestDecode, exc: Exception, events: list[BlockOutput]) -> None:
        """End ``decode`` as failed (its slot freed, the error in its output and in one last ``BlockOutput``)."""
        if decode in self._running:
            self._running.remove(decode)
        self.pool.free(decode.slot)
        decode.slot = None
        out = self._outputs[decode.request_id]
        out.status, out.error = "failed", f"{type(exc).__name__}: {exc}"
        events.append(BlockOutput(decode.request_id, decode.blocks - 1 if decode.blocks else 0, [], True, "failed",
                                  out.error))

    def rows_for(self, ready: list[RequestDecode]) -> list[torch.Tensor]:
        """Each ready request's rows for one verification forward (``RequestDecode.rows``). Without
        ``max_verify_rows`` each runs up to its own ``draft_budget`` drafts. With it the mains always run
        and the drafts share the rows they leave: the requests in turn, each up to an even share of the
        rows still free (rounded down, never above its own budget), so what one leaves unused (fewer
        drafts survived its graph's pruning, or its block's first call has none) goes to the ones after
        it. One request speculates with ``max_verify_rows - 1`` drafts; from ``max_verify_rows`` requests
        up none does and the engine runs vanilla's forwards: a forward of many requests is compute-bound,
        where a draft's rows cost about what its accepted tokens save. The lossless modes (vanilla,
        Spiffy, SpecFold at ``tau=0``) commit the same tokens under any limit, only their forwards depend
        on the load; SpecFold at ``tau > 0`` commits through its drafts' folded rows, so its tokens may
        then depend on the other requests (leave it None for batch-independent results)."""
        if self.max_verify_rows is None:
            rows = [self._ahead.pop(d) if d in self._ahead else d.rows() for d in ready]
            self._ahead.clear()  # rows of requests aborted since
            return rows
        rows = []

        def take(d: RequestDecode, share: int) -> int:
            rows.append(d.rows(share))
            return int(rows[-1].shape[0]) - 1
        share_drafts(ready, self.max_verify_rows, take)
        return rows

    def _rows_ahead(self, writing: list[RequestDecode]) -> None:
        """While a block write runs on the device, the next verification rows of the requests it does not
        write (their state stays as it is until that forward: ``rows_for`` takes them). Only where the
        rows do not depend on the next step's other requests (no ``max_verify_rows``) and the host builds
        them (the host loop)."""
        if self.max_verify_rows is not None or self.device_steps is not None or not self.rows_ahead:
            return
        for d in self._running:
            if d not in writing and d not in self._ahead and not d.block_done():
                self._ahead[d] = d.rows()
                self.stats.rows_built_ahead += 1

    def _verify(self, ready: list[RequestDecode], events: list[BlockOutput]) -> None:
        steps = self.device_steps
        run = self._replayed if self.graphs is not None else self._launched
        if steps is None:
            rows = self.rows_for(ready)
            positions = [d.logit_positions(r) for d, r in zip(ready, rows)]
            conf, tok = run(ready, rows, positions, [d.parents.tolist() for d in ready])
        else:  # the rows on the device, their masked positions on the host; the bookkeeping there, for all at once
            steps.load(ready)
            if self.max_verify_rows is not None:  # each call, built with the whole draft_budget, cut to its share
                steps.keep_drafts(ready, self.max_verify_rows)
            rows = steps.forward_rows(ready)
            positions = steps.logit_positions(ready)
            parents = [steps.next_parents[d.slot] for d in ready]
            if self.graphs is not None and self.mode == "specfold" and any(int(r.shape[0]) > 1 for r in rows):
                # the folded forward not waited for: its masks come back with the step's results
                outcomes, masks, overflows = steps.settle_folded(ready, positions, lambda read, level: (
                    self._folded_replay(ready, rows, positions, parents, True, read, level)))
                self.stats.overflows += overflows
                self._note_masks(ready, masks)
            else:
                conf, tok = run(ready, rows, positions, parents, True)
                outcomes = steps.settle(ready, positions, conf, tok)
        at = 0
        for i, (d, p) in enumerate(zip(ready, positions)):
            try:  # the commit rule and the drafts' walk on this request's rows alone (host), or their outcome
                if steps is None:
                    d.accept(conf[at:at + p.numel()], tok[at:at + p.numel()])
                else:
                    d.took_step(*outcomes[i])
            except Exception as exc:  # e.g. no progress on non-finite logits: this request fails alone
                self._fail(d, exc, events)
            at += p.numel()
        self.stats.verify_calls += 1
        self.stats.verify_rows += sum(int(r.shape[0]) for r in rows)
        self.stats.verify_requests += len(ready)

    def _note_masks(self, ready: list[RequestDecode], masks: list[torch.Tensor]) -> None:
        for d, m in zip(ready, masks):
            m = m.cpu()
            self._outputs[d.request_id].fold_masks.append(m)
            self.stats.gated_draft_positions += int(m[:, 1:].numel())
            self.stats.folded_draft_positions += int(m.sum())

    def _draftless(self, ready, rows) -> bool:
        """Whether a SpecFold step has no draft to fold (each request's main row alone, as under load with
        ``max_verify_rows``): it then runs the plain forward, which is the folded one's (a main row is
        never folded), and notes the masks that fold nothing."""
        if any(int(r.shape[0]) > 1 for r in rows):
            return False
        gates = gate_count(len(self.model.layers), "layer" if self.graphs is None else self.graphs.gate)
        self._note_masks(ready, [torch.zeros(gates, 1, int(r.shape[1]), dtype=torch.bool) for r in rows])
        return True

    def _replayed(self, ready, rows, positions, parents, on_device=False):
        """The forward replayed (``graphs.BatchGraphs.verify``): the confidences on the host (or device)."""
        slots = [d.slot for d in ready]
        if self.mode != "specfold" or self._draftless(ready, rows):
            res = self.graphs.verify(slots, rows, positions, self.confidence_dtype, on_device=on_device)
            return res.conf, res.tok
        res = self._folded_replay(ready, rows, positions, parents, on_device)
        self.stats.overflows += res.overflows
        self._note_masks(ready, res.masks)
        return res.conf, res.tok

    def _folded_replay(self, ready, rows, positions, parents, on_device, read_folds=True, first_level=0):
        """SpecFold's forward replayed (``BatchGraphs.verify``'s ``VerifyResult``)."""
        forced = [d.forced_fold_masks() for d in ready]
        return self.graphs.verify([d.slot for d in ready], rows, positions, self.confidence_dtype, parents, self.tau,
                                  forced if all(m is not None for m in forced) else None, on_device, read_folds,
                                  first_level)

    def _launched(self, ready, rows, positions, parents, on_device=False):
        """The forward launched: the confidences on the host (or device)."""
        args = (self.model, self.pool, [d.slot for d in ready], [r.to(self.device) for r in rows])
        if self.mode == "specfold" and not self._draftless(ready, rows):
            forced = [d.forced_fold_masks() for d in ready]
            logits, masks = verify_batch_folded(*args, [torch.tensor(p, dtype=torch.long) for p in parents],
                                                [p.to(self.device) for p in positions], self.tau,
                                                forced if all(m is not None for m in forced) else None,
                                                attention=self.attention,
                                                gate="layer" if self.graphs is None else self.graphs.gate)
            self._note_masks(ready, masks)
        else:
            logits = verify_batch(*args, [p.to(self.device) for p in positions], attention=self.attention)
        rules = self.model.config.decoding_rules
        conf, tok = confidence(torch.cat(logits), int(self.model.config.mask_token_id), self.confidence_dtype,
                               rules.argmax_of_probs)
        return (conf, tok) if on_device else (conf.cpu(), tok.cpu())

    def _settle(self, events: list[BlockOutput]) -> None:
        """Hand out finished blocks, retire done requests, write the others' blocks (batched); repeated
        while a freshly opened block is already finished (a seed that ends the request's tokens)."""
        while True:
            to_write = []
            for d in [d for d in self._running if d.block_done()]:
                tokens = d.end_block()
                out = self._outputs[d.request_id]
                out.blocks.append(tokens)
                if d.done:
                    self._running.remove(d)
                    self.pool.free(d.slot)
                    d.slot = None
                    out.status, out.result = "finished", d.result()
                else:
                    to_write.append(d)
                events.append(BlockOutput(d.request_id, d.blocks - 1, tokens, d.done, out.status))
            if not to_write:
                return
            slots = [d.slot for d in to_write]
            if self.graphs is not None:  # the write replayed; the next rows built while it runs, then its seeds
                read_seeds = self.graphs.write(slots, [d.state for d in to_write], read=False)
                self._rows_ahead(to_write)
                seeds = read_seeds()
            else:
                next_logits = write_blocks(self.model, self.pool, slots, [d.state.to(self.device) for d in to_write],
                                           attention=self.attention)
                seeds = seed_tokens(torch.stack(next_logits), int(self.model.config.mask_token_id))
            self.stats.write_calls += 1
            self.stats.written_blocks += len(to_write)
            for d, seed in zip(to_write, seeds):
                d.nfe += 1
                d.start_block(seed)

