"""Reading JSON a user hands us (config.json, draft graphs, prompt files) with a clear error for any bad file.

Python's parser recurses once per nesting level, so a deeply nested file raises ``RecursionError`` from
inside ``json``; ``loads`` measures the nesting first (iteratively) and refuses anything deeper than
``MAX_DEPTH`` levels, far more than any file of ours nests (a draft graph: 4).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

MAX_DEPTH = 64
# A JSON string literal (with escapes); brackets inside strings do not nest.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def nesting_depth(text: str) -> int:
    """Deepest bracket nesting of ``text`` outside string literals (no recursion)."""
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub('""', text)):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def loads(text: str, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` with one-line ``ValueError``s naming ``what`` (e.g. ``"draft_graph: file x.json"``)."""
    depth = nesting_depth(text)
    if depth > max_depth:
        raise ValueError(f"{what}: JSON nested {depth} levels deep; expected at most {max_depth}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what}: not valid JSON ({e})") from None
    except RecursionError:  # cannot happen below max_depth; kept so no traceback escapes
        raise ValueError(f"{what}: JSON nested too deeply") from None


def load_file(path: str | os.PathLike, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """Read and parse the JSON file at ``path``; unreadable files and bad JSON are one-line ValueErrors."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ValueError(f"{what} {os.fspath(path)!r}: cannot read ({reason})") from None
    return loads(text, f"{what} {os.fspath(path)!r}", max_depth)
