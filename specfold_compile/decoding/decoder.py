"""Vanilla, Spiffy and SpecFold block-diffusion decoding (docs/SPEC.md sections 1 and 3, property P5).

Model interface: ``models.protocol.DecodingModel`` (``config``, ``prefill``, the verification call,
``write_block``). The verification call gets ``logit_positions`` (int64 [M] flat positions ``n * B + p``,
the masked ones: the only logits the commit rule and the drafts read; rows independent, row 0 = main)
unless ``all_logits=True``. A prefill (an empty one: none), a verification call and a block write count
one NFE each. Where the prompt goes: ``prompt_layout``. SpecFold decodes as Spiffy does with the
verification forward compiled by the ``specfold`` backend (``specfold.specfold_forward``).

Spiffy bookkeeping. Let ``L`` be the logits of the state whose commit produced the current main state
``X`` (``X = commit(X_prev, L)`` is exact, vanilla would verify it next). One call verifies ``[X] +
drafts``, the drafts being predicted later states built from ``L`` (``graph.build_drafts``). Walk:
``Y = commit(X, L[0])``; while ``Y`` is not finished and some draft row equals ``Y`` token for token,
that row's logits are exactly ``model(Y)`` (rows are independent), so accept it and set ``Y =
commit(Y, L[row])``. The new main state is the last ``Y`` and the logits that produced it become the new
``L``. Every state Spiffy visits is a state vanilla visits with the same logits, hence the same tokens.
(The draft searched for is any row equal to ``Y``; in a deduplicated draft set that row is a child of the
last accepted row, or a state the dedup merged into an earlier row.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from . import boundaries
from .commit import block_finished, commit, confidence, spread_confidences
from .cuda_graphs import VerifyGraphs
from .defaults import CONFIDENCE_DTYPES, DEFAULTS
from .device_loop import check_logit_rows, decode_on_device, taking_logit_positions
from .dynamic import mark_dynamic_shapes
from .graph import build_drafts, default_graph, load_draft_graph
from ..models.protocol import DecodingModel, VerifyForward
from .prompt_layout import layout_prompt
from .result import GenerateResult, StepStats, model_consts
from .specfold import verification_forward

__all__ = ["generate", "GenerateResult", "StepStats", "record_traces", "mark_dynamic_shapes", "MODES"]

MODES = ("vanilla", "spiffy", "specfold")


def _check_int(name, v, lo):
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")


def _validate(prompt_ids, mode, max_new_tokens, threshold, draft_budget, stop_at_eos, compile_writes=False,
              all_logits=False, confidence_dtype=DEFAULTS.confidence_dtype):
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    _check_int("max_new_tokens", max_new_tokens, 1)
    _check_int("draft_budget", draft_budget, 0)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise TypeError(f"threshold must be a float in (0, 1], got {type(threshold).__name__}")
    if not (0.0 < float(threshold) <= 1.0):  # also rejects NaN
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    if not isinstance(prompt_ids, torch.Tensor):
        raise TypeError(f"prompt_ids must be a torch.Tensor, got {type(prompt_ids).__name__}")
    if prompt_ids.dtype != torch.int64:
        raise TypeError(f"prompt_ids must have dtype torch.int64, got {prompt_ids.dtype}")
    if prompt_ids.dim() != 1 or prompt_ids.numel() == 0:
        raise ValueError(f"prompt_ids must be a non-empty 1-D tensor, got shape {tuple(prompt_ids.shape)}")
    if not isinstance(stop_at_eos, bool):
        raise TypeError(f"stop_at_eos must be a bool, got {type(stop_at_eos).__name__}")
    if not isinstance(compile_writes, bool):
        raise TypeError(f"compile_writes must be a bool, got {type(compile_writes).__name__}")
    if not isinstance(all_logits, bool):
        raise TypeError(f"all_logits must be a bool, got {type(all_logits).__name__}")
    if not isinstance(confidence_dtype, str) or confidence_dtype not in CONFIDENCE_DTYPES:
        raise ValueError(f"confidence_dtype must be one of {CONFIDENCE_DTYPES}, got {confidence_dtype!r}")


@dataclass(frozen=True)
class _Scoring:
    """How one decode turns logits into commits: ``confidence``'s dtype and argmax, ``commit``'s rule."""

    mask_id: int
    sub_block_size: int | None
    threshold: float
    dtype: str              # generate's confidence_dtype
    argmax_of_probs: bool   # DecodingRules
    inclusive: bool         # DecodingRules.threshold_inclusive

    def confidence(self, logits):
        return confidence(logits, self.mask_id, self.dtype, self.argmax_of_probs)

    def commit(self, state, conf, tok):
        return commit(state, conf, tok, self.mask_id, self.sub_block_size, self.threshold, self.inclusive)


def commit_and_accept(scoring: _Scoring, X: torch.Tensor, rows: torch.Tensor, conf: torch.Tensor,
                      tok: torch.Tensor, fin) -> tuple[torch.Tensor, int, int]:
    """One call's outcome: the commit rule on the main row, then Spiffy's acceptance walk (while the block
    is not finished, the committed state equal to a draft row is accepted and committed from that row's
    confidences). Returns the new state, the accepted drafts and the row whose logits produced it."""
    cur, accepted = 0, 0
    Y = scoring.commit(X, conf[0], tok[0])
    if rows.shape[0] > 1:
        row_of = {tuple(r): i for i, r in enumerate(rows.tolist()) if i > 0}
        while not fin(Y):
            r = row_of.pop(tuple(Y.tolist()), None)
            if r is None:
                break
            accepted += 1
            cur = r
            Y = scoring.commit(Y, conf[r], tok[r])
    return Y, accepted, cur


def _verify(model: VerifyForward | DecodingModel, rows: torch.Tensor, parents: list[int], cache, mask_id: int,
            all_logits: bool, graphs: VerifyGraphs | None = None, scoring: _Scoring | None = None,
            device: torch.device | None = None, seed_slots: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One verification call -> per-position ``(conf, tok)`` [N, B] on the CPU. Unless ``all_logits``, the
    model computes the logits of the masked positions only; the other positions get conf 0 and the mask
    token, which nothing reads (commits and drafts only look at masked positions). ``graphs``: the call
    is a CUDA graph replay (``VerifyGraphs``). ``scoring``: the decode's (None: ``generate``'s default
    confidences, read from ``model.config``: a ``DecodingModel`` then); ``device``: the model's (None: the
    cache keys'). ``seed_slots``: position 0 of every row too (under the Fast-dLLM shift, the prediction
    of the next block's first token: ``fuse_boundaries``' guess of the seed)."""
    if scoring is None:
        rules = model.config.decoding_rules
        scoring = _Scoring(mask_id, None, DEFAULTS.threshold, DEFAULTS.confidence_dtype, rules.argmax_of_probs,
                           rules.threshold_inclusive)
    device = cache.keys[0].device if device is None else device
    tokens, parent_ids = rows.to(device), torch.tensor(parents, dtype=torch.long, device=device)
    if all_logits:
        if graphs is not None:
            logits = graphs(tokens, parent_ids, cache, None)
        else:
            mark_dynamic_shapes(tokens, parent_ids, cache)
            logits = model(tokens, parent_ids, cache)
        conf, tok = scoring.confidence(logits)
        return conf.cpu(), tok.cpu()
    wanted = rows == mask_id
    if seed_slots:
        wanted[:, 0] = True
    masked = wanted.flatten().nonzero().flatten()
    positions = masked.to(device)
    with taking_logit_positions():
        if graphs is not None:
            logits = graphs(tokens, parent_ids, cache, positions)
        else:
            mark_dynamic_shapes(tokens, parent_ids, cache, positions)
            logits = model(tokens, parent_ids, cache, logit_positions=positions)
    check_logit_rows(logits, positions)
    conf_m, tok_m = scoring.confidence(logits)
    conf, tok = spread_confidences(conf_m.cpu(), tok_m.cpu(), masked, rows.numel(), mask_id)
    return conf.view(rows.shape), tok.view(rows.shape)


def _decode(model: DecodingModel, prompt_ids, mode, max_new_tokens, threshold, draft_budget, graph, stop_at_eos,
            trace=None, compile_writes=False, all_logits=False, graphs: VerifyGraphs | None = None,
            confidence_dtype: str = DEFAULTS.confidence_dtype, forward: VerifyForward | None = None,
            fuse_boundaries: bool | str = False) -> GenerateResult:
    """The decode loop; ``forward``: the verification call (None: ``model`` itself)."""
    forward = model if forward is None else forward
    B, sb, mask_id, eos_id = model_consts(model)
    rules = model.config.decoding_rules
    layout = layout_prompt(prompt_ids, B, rules.prompt_on_block_grid)
    layout.check_positions(max_new_tokens, int(model.config.max_position_embeddings))  # before any forward
    scoring = _Scoring(mask_id, sb, threshold, confidence_dtype, rules.argmax_of_probs, rules.threshold_inclusive)
    eos = eos_id if stop_at_eos else None
    spiffy = mode != "vanilla" and draft_budget > 0 and graph is not None and len(graph) > 0
    writes = {"compiled": True} if compile_writes else {}  # other models' prefill need not take it
    device = prompt_ids.device
    guessing = bool(fuse_boundaries) and bool(model.config.shift_logits)  # each call also predicts the next seed
    t0 = time.perf_counter()
    # verified: (state, logits [B, V]) of the next block's first state, from the pass before it
    # with graphs: a static cache with room for every block this call may write (and verify)
    cache, verified = boundaries.prefill(model, layout, writes, boundaries.fuses_prefill(fuse_boundaries), B,
                                         mask_id, device, graphs,
                                         layout.last_block_start(max_new_tokens) + (B if fuse_boundaries else 0))
    if graphs is not None:
        captures0, replays0 = graphs.captures, graphs.replays
    nfe = 1 if layout.prefill_ids.numel() else 0
    out: list[int] = []
    steps: list[StepStats] = []
    nblocks = 0
    head = layout.head  # the first block's fixed prompt tokens (Fast-dLLM v2's absolute grid)
    while True:
        nblocks += 1
        start = len(head)  # the block's generated positions: [start, start + need)
        need = min(B - start, max_new_tokens - len(out))
        X = boundaries.first_state(head, cache, B, mask_id)
        head = []

        def fin(st, need=need, start=start):
            return block_finished(st, mask_id, need, eos, start)

        prev = None  # (conf, tok) of the logits that produced X
        tb = None
        if trace is not None:
            tb = {"states": [], "conf": [], "argmax": []}
            trace.append(tb)
        verified = boundaries.confirmed(verified, X)
        while not fin(X):
            fused = verified is not None
            if fused:  # the first call's logits came with the pass that wrote the prefix
                rows, parents = X.unsqueeze(0), [-1]
                conf, tok = (t.cpu() for t in scoring.confidence(verified[1][None]))
                verified = None
            else:
                if spiffy and prev is not None:
                    d = build_drafts(X, prev[0], prev[1], graph, mask_id, sb, draft_budget, fin)
                    rows = torch.stack([X] + d.states)
                    parents = [-1] + d.parents
                else:
                    rows = X.unsqueeze(0)
                    parents = [-1]
                # traces record every position's confidence: all logits there
                conf, tok = _verify(forward, rows, parents, cache, mask_id, all_logits or tb is not None, graphs,
                                    scoring, device, seed_slots=guessing)
                nfe += 1
            if tb is not None:
                tb["states"].append(X.tolist())
                tb["conf"].append(conf[0].tolist())
                tb["argmax"].append(tok[0].tolist())
            Y, accepted, cur = commit_and_accept(scoring, X, rows, conf, tok, fin)
            steps.append(StepStats(branches=rows.shape[0], accepted=accepted, parents=parents, rows=rows, fused=fused))
            if torch.equal(X, Y):  # cannot happen: every step commits >= 1 non-mask token
                raise RuntimeError("decoding made no progress (non-finite logits?)")
            X = Y
            prev = (conf[cur], tok[cur])
        if tb is not None:
            tb["states"].append(X.tolist())
        blk = X[start:start + need].tolist()
        stop = False
        if eos is not None and eos in blk:
            blk = blk[: blk.index(eos) + 1]
            stop = True
        out.extend(blk)
        if stop or len(out) >= max_new_tokens:
            break
        nxt = None
        if guessing:
            nxt = boundaries.seed_guess(model, prev is not None, int(prev[1][0]) if prev is not None else mask_id,
                                        mask_id, min(B, max_new_tokens - len(out)), eos, B)
        cache, verified = boundaries.write(model, cache, X, graphs, compile_writes, nxt, device)
        nfe += 1
    wall = time.perf_counter() - t0
    result = GenerateResult(tokens=out, nfe=nfe, wall_time_s=wall, steps=steps, mode=mode, blocks=nblocks)
    if graphs is not None:
        result.graph_captures, result.graph_replays = graphs.captures - captures0, graphs.replays - replays0
    return result


def generate(model: DecodingModel, prompt_ids: torch.Tensor, mode: str = "vanilla",
             max_new_tokens: int = DEFAULTS.max_new_tokens, threshold: float = DEFAULTS.threshold,
             draft_budget: int = DEFAULTS.draft_budget, draft_graph=None,
             stop_at_eos: bool = True, compile_writes: bool = False, all_logits: bool = False,
             cuda_graphs: bool | VerifyGraphs = False,
             confidence_dtype: str = DEFAULTS.confidence_dtype, tau: float | None = None,
             specfold_options: dict | None = None, loop: str = "host",
             fuse_boundaries: bool | str = DEFAULTS.fuse_boundaries, steps_per_read: int = 1) -> GenerateResult:
    """Greedy block-diffusion decoding of ``prompt_ids`` (1-D int64). Defaults: ``decoding.DEFAULTS``.

    ``mode="vanilla"``: one forward per denoising step. ``mode="spiffy"``: each forward also verifies up
    to ``draft_budget`` draft states from ``draft_graph`` (a path, dict or ``DraftGraph``; ``None`` ->
    ``default_draft_graph(block_size)``); the output tokens equal vanilla's (P5). ``mode="specfold"``:
    Spiffy's calls through the verification forward compiled with the ``specfold`` backend at ``tau``
    (None: the backend's default) and backend ``specfold_options`` (e.g. ``{"kernels": "torch"}``), kept
    per model and options (``specfold_forward``); at ``tau=0`` it decodes Spiffy's tokens (float32, up to
    near-ties). Prefill and block writes stay the model's (``compile_writes``: default backend).

    The prompt is laid out as the family's reference ``generate`` lays it out
    (``model.config.decoding_rules``, ``prompt_layout``): Fast-dLLM v2 on the absolute block grid, its
    prompt's whole blocks prefilled block-causally and its last ``L mod B`` tokens opening the first
    block (which then generates ``B - L mod B`` tokens; unlike the reference, a prompt of exactly one
    block is not dropped, see ``prompt_layout``); NLD with a causal prefill and the first block right
    after the prompt.

    ``tokens`` holds generated tokens only: at most ``max_new_tokens`` or (``stop_at_eos``) up to the
    first eos, which is included (the references count ``max_new_tokens`` in whole blocks; the tokens
    here are theirs cut there). Positions past those are never decoded, so the last block may end early.
    The prompt and every block the generation may need must fit within the model's
    ``max_position_embeddings`` (checked before any forward; a one-line ``ValueError`` otherwise).

    ``confidence_dtype``: ``"model"`` (default) computes the softmax in the logits' dtype and compares it
    with the threshold cast to that dtype, as both references do: a bf16 Fast-dLLM v2 commits where the
    bf16 probability exceeds bf16(0.9) = 0.8984375 (an fp32 probability above about 0.90039), a bf16 NLD
    where it is at least 0.8984375 (an fp32 probability of at least about 0.89648): the same commits as
    the reference ``generate`` (NLD's one exception: when no probability passes, its reference takes a
    ``torch.topk`` maximum, whose order among tied bf16 maxima is unspecified; here the lowest position;
    and neither reference excludes the mask token from the argmax, which can stall it). ``"float32"``: the
    softmax of the logits cast to float32 against the threshold in float32. In float32 models the two
    agree (up to the last bit of the softmax). The comparison is the family's either way (``p > t``
    Fast-dLLM v2, ``p >= t`` NLD); Spiffy's acceptance walk and drafts read the same confidences, so P5
    holds under both.

    ``compile_writes``: run the prompt prefill and the block writes through ``torch.compile`` (default
    backend) too. ``torch.compile(model, ...)`` compiles the verification forward only; a decode loop
    that compiles its model usually wants these compiled as well (gpt-fast's ``compile_prefill``). With
    ``cuda_graphs`` at the 1.5B shape it took a math prompt's replayed prefill from 4.8 to 2.7 ms, for a
    few minutes of compilation on first use (docs/benchmarks.md, "Prefill and block writes compiled").

    ``all_logits``: ask the model for every position's logits (``model(tokens, parents, cache)``), for a
    model whose forward takes no ``logit_positions``. By default it computes the masked positions' only
    (59-62% of a multi-branch call's rows on the trained model): the same tokens up to rounding, a
    smaller LM head and softmax. The device loop asks for the same positions in every row, the main
    state's masked ones and position 0, their count padded to a power of two (``device_loop``).

    ``cuda_graphs``: replay every verification call from a CUDA graph (``VerifyGraphs``: a static prefix
    cache, one graph per branch count and padded logit-row count, captured on first use). ``True`` makes
    a ``VerifyGraphs`` for this call; pass one ``VerifyGraphs(model)`` to every call to keep its graphs
    from prompt to prompt. Same tokens as launched calls, up to the kernels' rounding (except that a
    SpecFold-compiled model folds captured calls while its launched ones run the plain graph, by
    default); block writes replay too (``VerifyGraphs(model, capture_writes=False)`` launches them), and
    so does the prompt's prefill, straight into the static cache (``capture_prefill=False`` launches it
    and copies it in). A launched call is host-bound on the H200 (``cuda_graphs``'
    module docstring), so this is where the forward's GPU speed, and SpecFold's folding, reach the loop.

    ``loop``: ``"host"`` (default) runs each step's bookkeeping (commits, the acceptance walk, the drafts)
    in Python; ``"device"`` runs it as tensor ops on the model's device (``device_loop``: with
    ``cuda_graphs`` each step, forward and bookkeeping, is one CUDA graph replay), the same tokens and
    forwards. ``steps_per_read`` (device loop): steps launched before the host reads their outcomes
    (default 1). With k > 1 a block's last step is followed by up to k - 1 launched steps that change
    nothing but still run their forward, and the host waits once per k steps instead of once per step.
    Measured on the shipped model (docs/benchmarks.md, "Steps launched ahead") that wait was small and
    k = 2 or 4 was slower: keep 1 unless such steps can be skipped on the device.

    ``fuse_boundaries``: verify a block's first state in the pass that writes the prefix before it
    instead of a call of its own, one forward fewer per block boundary, the same tokens (P5). After the
    prompt's prefill when the first state needs no seed (Fast-dLLM v2 with ``L mod B != 0``: the prompt's
    tail opens the block), exactly. After a block write with the seed guessed: under the Fast-dLLM shift
    every call predicts the token after the block (position 0's logits), the write verifies the next
    block opened with that guess, and its logits are used only when the write's own seed equals the
    guess (else the block's first call runs as usual). A family without the shift (NLD) has no such
    prediction: its writes stay separate. ``steps`` keeps such a step, ``fused`` set; ``nfe`` counts
    the one pass. ``fuse_boundaries="writes"`` fuses the block writes only (the prefill stays a pass of
    its own, the first block's first state a call of its own).
    """
    if loop not in ("host", "device"):
        raise ValueError(f"loop: expected 'host' or 'device', got {loop!r}")
    _validate(prompt_ids, mode, max_new_tokens, threshold, draft_budget, stop_at_eos, compile_writes, all_logits,
              confidence_dtype)
    boundaries.check_fuse_boundaries(fuse_boundaries)
    _check_int("steps_per_read", steps_per_read, 1)
    if steps_per_read != 1 and loop != "device":
        raise ValueError(f"steps_per_read: only loop='device' launches steps ahead, got {steps_per_read} with "
                         f"loop={loop!r}")
    forward = verification_forward(model, mode, tau, specfold_options)
    if isinstance(cuda_graphs, VerifyGraphs):
        # the same module compiled otherwise (or eager) is another target
        if cuda_graphs.model is not model or cuda_graphs.forward is not forward:
            raise ValueError("cuda_graphs: this VerifyGraphs was made for another model or forward (make one per "
                             "model object passed to generate, compiled wrappers included; mode='specfold': "
                             "VerifyGraphs(model, forward=specfold_forward(model, tau, specfold_options)))")
        graphs = cuda_graphs
    elif isinstance(cuda_graphs, bool):
        graphs = VerifyGraphs(model, forward=forward) if cuda_graphs else None
    else:
        raise TypeError(f"cuda_graphs: expected a bool or a VerifyGraphs, got {type(cuda_graphs).__name__}")
    if graphs is not None and graphs.replay == "cuda" and prompt_ids.device.type != "cuda":
        raise ValueError(f"cuda_graphs: CUDA graphs need the model and prompt_ids on a CUDA device, got "
                         f"{prompt_ids.device}; VerifyGraphs(model, replay='eager') runs the same loop without graphs")
    B = int(model.config.block_size)
    graph = None
    if mode != "vanilla":
        graph = default_graph(B) if draft_graph is None else load_draft_graph(draft_graph, B)
    elif draft_graph is not None:
        load_draft_graph(draft_graph, B)  # still reject a malformed graph
    with torch.inference_mode():
        if loop == "device":
            return decode_on_device(model, prompt_ids, mode, max_new_tokens, float(threshold), draft_budget, graph,
                                    stop_at_eos, compile_writes, graphs, confidence_dtype, forward=forward,
                                    fuse_boundaries=fuse_boundaries, steps_per_read=steps_per_read,
                                    all_logits=all_logits)
        return _decode(model, prompt_ids, mode, max_new_tokens, float(threshold), draft_budget, graph,
                       stop_at_eos, compile_writes=compile_writes, all_logits=all_logits, graphs=graphs,
                       confidence_dtype=confidence_dtype, forward=forward, fuse_boundaries=fuse_boundaries)


def record_traces(model: DecodingModel, prompts, max_new_tokens: int = DEFAULTS.max_new_tokens,
                  threshold: float = DEFAULTS.threshold, stop_at_eos: bool = True,
                  confidence_dtype: str = DEFAULTS.confidence_dtype) -> dict:
    """Run vanilla decoding on every prompt and record, per block, the state before each step and that
    step's per-position confidence / argmax (plus the final state). JSON-serialisable::

        {"block_size", "sub_block_size", "mask_token_id", "threshold", "confidence_dtype",
         "blocks": [{"states": [[B ints] * (n+1)], "conf": [[B floats] * n], "argmax": [[B ints] * n]}]}
    """
    B, sb, mask_id, _ = model_consts(model)
    blocks: list = []
    for i, p in enumerate(prompts):
        if not isinstance(p, torch.Tensor):
            p = torch.tensor(list(p), dtype=torch.long)
        _validate(p, "vanilla", max_new_tokens, threshold, 0, stop_at_eos, confidence_dtype=confidence_dtype)
        with torch.inference_mode():
            _decode(model, p, "vanilla", max_new_tokens, float(threshold), 0, None, stop_at_eos,
                    trace=blocks, confidence_dtype=confidence_dtype)
    return {"block_size": B, "sub_block_size": sb, "mask_token_id": mask_id, "threshold": float(threshold),
            "confidence_dtype": confidence_dtype, "blocks": [b for b in blocks if b["conf"]]}
