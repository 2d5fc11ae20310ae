"""The pieces every benchmark page renderer shares (``bench.report``, ``bench.report_batched``): the
shapes' and modes' names in words, a page's sections, number cells, markdown tables and row selection."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

SHAPES = {"fast-dllm-v2-1.5b": "1.5B", "fast-dllm-v2-7b": "7B", "nld-3b": "NLD-3B"}
E2E_MODES = {"vanilla": "vanilla", "spiffy": "Spiffy, eager", "spiffy_compiled": "Spiffy, Inductor",
             "specfold": "SpecFold"}  # the end-to-end suite's modes, in its order


@dataclass(frozen=True)
class Section:
    """One section of docs/benchmarks.md: a title, the result file it renders, the command that made the
    file, what the numbers are, and the renderer of its tables."""

    title: str
    path: str       # relative to bench/results/
    command: str
    what: str
    render: Callable[[dict], list[str]]


def fmt(x: float | None, digits: int = 2) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def matching(data: dict, **match) -> list[dict]:
    return [r for r in data["rows"] if all(r.get(k) == v for k, v in match.items())]


def first_matching(data: dict, **match) -> dict | None:
    found = matching(data, **match)
    return found[0] if found else None
