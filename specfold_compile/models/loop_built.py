"""``loop_built_rows()``: the context in which a decode loop runs the forwards and block writes whose
rows it built itself, so that their data checks (a host read each) are skipped (``checks``' module
docstring). Apart from ``checks`` so that the cache's block-write checks can read it too."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

__all__ = ["loop_built_rows", "in_loop_built_rows"]

_loop_built = contextvars.ContextVar("specfold_loop_built_rows", default=False)


@contextlib.contextmanager
def loop_built_rows() -> Iterator[None]:
    """Inside it, ``check_values`` and ``check_block``'s id check are skipped: the caller built the rows."""
    token = _loop_built.set(True)
    try:
        yield
    finally:
        _loop_built.reset(token)


def in_loop_built_rows() -> bool:
    """Whether the caller runs inside ``loop_built_rows()``."""
    return _loop_built.get()
