"""Synthetic evaluation tasks: math (GSM8K-like), code (MBPP-like), instruct (IFEval-like).

Each task has a generator with disjoint splits ("train", "calib", "test", by hashing the problem skeleton),
a prompt, a reference response and an exact checker ``score(problem, response_text) -> bool``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from types import ModuleType

from . import code_task, instruct_task, math_task
from .base import SPLITS, Problem, sample_split, split_of

TASKS = ("math", "code", "instruct")
_MODULES: dict[str, ModuleType] = {"math": math_task, "code": code_task, "instruct": instruct_task}

# Prompt format shared by training and every decoder: <|bos|> + prompt + SEPARATOR, then the response
# tokens, then <|eos|>. The separator is a special token so the prompt/response boundary tokenizes cleanly.
BOS, EOS, MASK, PAD, SEP = "<|bos|>", "<|eos|>", "<|mask|>", "<|pad|>", "<|sep|>"
SPECIAL_TOKENS = (MASK, EOS, BOS, PAD, SEP)


def get_task(name: str) -> ModuleType:
    """The task module: ``make(rng)``, ``score(problem, response)``, ``NAME``."""
    if name not in _MODULES:
        raise ValueError(f"task: expected one of {TASKS}, got {name!r}")
    return _MODULES[name]


def sample(task: str, split: str, n: int, seed: int = 0) -> list[Problem]:
    """n problems of ``task`` from ``split``, deterministic in (task, split, n, seed)."""
    return sample_split(task, get_task(task).make, split, n, seed)


def score(problem: Problem, response: str, unsafe_run_code: bool = False) -> bool:
    """``unsafe_run_code``: the code task may run responses unsandboxed where no sandbox can be built
    (else it raises ``SandboxUnavailable``; see ``sandbox.py``)."""
    if problem.task == code_task.NAME:
        return bool(code_task.score(problem, response, unsafe_run_code=unsafe_run_code))
    return bool(get_task(problem.task).score(problem, response))


def score_many(problems: list[Problem], responses: list[str], workers: int = 8,
               unsafe_run_code: bool = False) -> list[bool]:
    """Score in parallel (code runs one sandbox per problem)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda p, r: score(p, r, unsafe_run_code), problems, responses))


def format_prompt(prompt: str) -> str:
    return f"{BOS}{prompt}{SEP}"


__all__ = ["TASKS", "SPLITS", "Problem", "get_task", "sample", "score", "score_many", "split_of",
           "format_prompt", "SPECIAL_TOKENS", "BOS", "EOS", "MASK", "PAD", "SEP"]
