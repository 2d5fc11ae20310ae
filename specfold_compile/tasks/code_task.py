"""MBPP-like: a one-sentence spec of a small Python function ``f``; the response is its source.

Families: list pipelines (filter -> map -> reduce over ``xs``), string transform chains over ``s`` (1-2
steps) and arithmetic on ``a, b``. Scored by running the response on hidden test cases in an OS-level
sandbox (see ``sandbox.py``) and comparing ``repr`` of every result with the reference's. Where no sandbox
can be built, scoring raises ``SandboxUnavailable`` unless ``unsafe_run_code=True`` accepts the risk.
"""

from __future__ import annotations

import random

from .base import Problem
from .sandbox import run_candidate

NAME = "code"

_LETTERS = "abcdeilnorst"


def _list_problem(rng: random.Random) -> tuple[str, str, str, list]:
    k = rng.randint(2, 9)
    filt = rng.choice(["none", "even", "odd", "gt", "lt", "div"])
    if filt == "div":
        k = rng.randint(2, 5)
    coll, cond = {
        "none": ("the numbers in xs", ""),
        "even": ("the even numbers in xs", " if x % 2 == 0"),
        "odd": ("the odd numbers in xs", " if x % 2 == 1"),
        "gt": (f"the numbers in xs greater than {k}", f" if x > {k}"),
        "lt": (f"the numbers in xs less than {k}", f" if x < {k}"),
        "div": (f"the numbers in xs divisible by {k}", f" if x % {k} == 0"),
    }[filt]
    m = rng.randint(2, 9)
    mp = rng.choice(["none", "square", "times", "plus"])
    what, expr = {
        "none": (coll, "x"),
        "square": (f"the squares of {coll}", "x * x"),
        "times": (f"{m} times {coll}", f"x * {m}"),
        "plus": (f"{coll} each plus {m}", f"x + {m}"),
    }[mp]
    red = rng.choice(["sum", "list", "count", "max"])
    if red == "count":
        mp, m = "none", 0
        spec = f"returns how many of {coll} there are"
        body = f"len([x for x in xs{cond}])"
    elif red == "sum":
        spec = f"returns the sum of {what}"
        body = f"sum({expr} for x in xs{cond})"
    elif red == "list":
        spec = f"returns a list of {what}"
        body = f"[{expr} for x in xs{cond}]"
    else:
        spec = f"returns the largest of {what}, or 0 if there are none"
        body = f"max([{expr} for x in xs{cond}], default=0)"
    source = f"def f(xs):\n    return {body}\n"
    tests = [[[rng.randint(-5, 20) for _ in range(rng.randint(0, 8))]] for _ in range(6)]
    key = f"list|{filt}|{k if filt in ('gt', 'lt', 'div') else 0}|{mp}|{m if mp in ('times', 'plus') else 0}|{red}"
    return key, f"Write a function f(xs) that {spec}.", source, tests


def _string_problem(rng: random.Random) -> tuple[str, str, str, list]:
    steps = []
    for _ in range(rng.randint(1, 2)):
        op = rng.choice(["reverse", "upper", "lower", "replace", "first"])
        if op == "replace":
            a, b = rng.sample(_LETTERS, 2)
            steps.append((f"with every '{a}' replaced by '{b}'", f".replace('{a}', '{b}')", f"replace-{a}{b}"))
        elif op == "first":
            n = rng.randint(2, 6)
            steps.append((f"cut to its first {n} characters", f"[:{n}]", f"first-{n}"))
        elif op == "reverse":
            steps.append(("reversed", "[::-1]", "reverse"))
        elif op == "upper":
            steps.append(("in upper case", ".upper()", "upper"))
        else:
            steps.append(("in lower case", ".lower()", "lower"))
    count = rng.random() < 0.25
    desc = " and then ".join(s[0] for s in steps)
    chain = "".join(s[1] for s in steps)
    if count:
        c = rng.choice(_LETTERS)
        spec = f"returns how many times '{c}' appears in s {desc}"
        body = f"s{chain}.count('{c}')"
        ckey = c
    else:
        spec = f"returns s {desc}"
        body = f"s{chain}"
        ckey = ""
    source = f"def f(s):\n    return {body}\n"
    alphabet = _LETTERS + _LETTERS.upper()[:4] + " "
    tests = [["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))] for _ in range(6)]
    key = "str|" + ">".join(s[2] for s in steps) + f"|count={ckey}"
    return key, f"Write a function f(s) that {spec}.", source, tests


def _arith_problem(rng: random.Random) -> tuple[str, str, str, list]:
    name, op = rng.choice([("sum", "+"), ("difference", "-"), ("product", "*")])
    k = rng.randint(2, 9)
    post = rng.choice(["none", "times", "plus", "minus"])
    base = f"a {op} b"
    spec, body = {
        "none": (f"returns the {name} of a and b", base),
        "times": (f"returns the {name} of a and b, multiplied by {k}", f"({base}) * {k}"),
        "plus": (f"returns the {name} of a and b, plus {k}", f"{base} + {k}"),
        "minus": (f"returns the {name} of a and b, minus {k}", f"{base} - {k}"),
    }[post]
    source = f"def f(a, b):\n    return {body}\n"
    tests = [[rng.randint(-20, 30), rng.randint(-20, 30)] for _ in range(6)]
    key = f"arith|{name}|{post}|{k if post != 'none' else 0}"
    return key, f"Write a function f(a, b) that {spec}.", source, tests


def make(rng: random.Random) -> Problem:
    r = rng.random()
    gen = _list_problem if r < 0.55 else (_string_problem if r < 0.9 else _arith_problem)
    key, prompt, source, tests = gen(rng)
    return Problem(NAME, key, prompt, source, {"tests": tests, "entry": "f"})


def expected_outputs(problem: Problem) -> list[str]:
    """repr of the reference's result on every hidden test (computed in-process: the reference is our own
    generated code, trusted; computed lazily so generating training data stays fast)."""
    ns: dict = {}
    exec(compile(problem.reference, "<reference>", "exec"), ns)
    return [repr(ns[problem.meta["entry"]](*args)) for args in problem.meta["tests"]]


def score(problem: Problem, response: str, timeout: float = 2.0, unsafe_run_code: bool = False) -> bool:
    result = run_candidate(response, problem.meta["entry"], problem.meta["tests"], timeout_s=timeout,
                           unsafe_run_code=unsafe_run_code)
    return result.values is not None and result.values == expected_outputs(problem)
