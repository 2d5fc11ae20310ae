"""Dynamo's recompile limit, which would otherwise turn a ``backend="specfold"`` call into a silent eager one.

Dynamo keeps at most ``torch._dynamo.config.recompile_limit`` graphs (default 8) per Python function;
past it, it logs one warning and runs new calls of that function eagerly: no backend, nothing folds,
no error. SpecFold needs several graphs of a model's forward for one set of options (a decode loop
compiled 7: N = 1 and any N, a dynamic and a static cache, all logits or selected ones), and every
other set of options (every tau of a sweep) needs as many again. So:

* when the backend compiles a verification graph it raises the limit to at least
  ``MIN_RECOMPILE_LIMIT`` (logged at INFO; a higher limit set by the user is kept);
* it watches Dynamo's limit warning (a filter on the ``torch._dynamo.convert_frame`` logger) and, for a
  function it compiled, adds a Python warning that says what happened and what to do, or raises
  ``RecompileLimitError`` when any of that function's graphs was compiled with ``strict=True``.
  (Silencing Dynamo's warnings through logging silences this too.) The record of a function starts
  afresh when the backend compiles it while Dynamo holds no graph of it (the first compile, or the first
  after ``torch._dynamo.reset()``): a strict compile that was reset away does not make later ones strict.
"""

from __future__ import annotations

import logging
import threading
import types
import warnings

import torch

log = logging.getLogger("specfold_compile")

MIN_RECOMPILE_LIMIT = 64
_DYNAMO_LOGGER = "torch._dynamo.convert_frame"
_LIMIT_MESSAGE = "torch._dynamo hit config."

_lock = threading.Lock()
_functions: dict[str, bool] = {}  # function (as Dynamo names it) -> strict
_installed = [False]


class RecompileLimitError(RuntimeError):
    """Raised (``strict=True``) when Dynamo stops compiling a function the specfold backend compiled."""


def _current_code() -> types.CodeType | None:
    """The code object Dynamo is compiling; None outside a Dynamo compile (compile_graph called directly)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        return InstructionTranslator.current_tx().f_code
    except Exception:
        return None


def _original_code(code: types.CodeType) -> types.CodeType:
    """The user function a Dynamo resume function continues (after a graph break, such as the model's
    input checks at the top of ``forward``, the graph is compiled in a generated
    ``torch_dynamo_resume_in_forward_at_N`` function, while the recompile-limit message names ``forward``)."""
    try:  # Dynamo's private cache: original code -> {key: resume code}, held by id with weak references
        from torch._dynamo.resume_execution import ContinueExecutionCache

        cache = ContinueExecutionCache.cache
        parent_of = {id(resume): cache.refs[idx]() for idx, resumes in list(cache.values.items())
                     for resume in resumes.values()}
    except Exception:
        return code
    for _ in range(32):  # resume functions of resume functions
        parent = parent_of.get(id(code))
        if parent is None:
            return code
        code = parent
    return code


def current_function() -> str | None:
    """The function Dynamo is compiling, named as in its log messages: ``'forward' (file:line)``."""
    code = _current_code()
    if code is None:
        return None
    code = _original_code(code)
    return f"'{code.co_name}' ({code.co_filename}:{code.co_firstlineno})"


def _has_cached_graphs(code: types.CodeType | None) -> bool:
    """Whether Dynamo holds a compiled graph of ``code`` (the one being compiled is added after the backend
    returns, so this is False for a function's first compile and the first after a reset)."""
    if code is None:
        return True  # unknown: keep what is recorded
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return bool(_debug_get_cache_entry_list(code))


def compile_id() -> str:
    cid = torch._guards.CompileContext.current_compile_id()
    return str(cid) if cid is not None else "?"


class _LimitFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith(_LIMIT_MESSAGE)):
            return True
        text = record.getMessage()
        with _lock:
            hits = [(name, strict) for name, strict in _functions.items() if name in text]
        if not hits:
            return True
        name, strict = hits[0][0], any(strict for _, strict in hits)
        limit = text[len(_LIMIT_MESSAGE):].split("\n", 1)[0]  # e.g. "recompile_limit (8)"
        message = (f"specfold: Dynamo hit config.{limit} for {name}: it now runs new calls of it eagerly, "
                   f"without the specfold backend (nothing folds). Every set of backend options (every tau) "
                   f"needs its own graphs: raise torch._dynamo.config.recompile_limit, or call "
                   f"torch._dynamo.reset() between option sets")
        if strict:
            raise RecompileLimitError(message)
        warnings.warn(message, stacklevel=2)
        return True


def watch(function: str | None, strict: bool, verification: bool) -> None:
    """Called for every graph the backend compiles (``function``: ``current_function()``)."""
    with _lock:
        if not _installed[0]:
            logging.getLogger(_DYNAMO_LOGGER).addFilter(_LimitFilter())
            _installed[0] = True
        if function is not None:
            earlier = _functions.get(function, False) and _has_cached_graphs(_current_code())
            _functions[function] = earlier or strict
    config = torch._dynamo.config
    if verification and config.recompile_limit < MIN_RECOMPILE_LIMIT:
        log.info("specfold: raising torch._dynamo.config.recompile_limit from %d to %d (one set of backend "
                 "options needs several graphs of a forward)", config.recompile_limit, MIN_RECOMPILE_LIMIT)
        config.recompile_limit = MIN_RECOMPILE_LIMIT
