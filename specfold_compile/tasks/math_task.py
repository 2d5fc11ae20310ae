"""GSM8K-like multi-step arithmetic word problems (2-3 steps, small numbers).

Response: one equation per line (``a + b = c``), then ``answer: N``. Scored by the final answer only.
"""

from __future__ import annotations

import random
import re

from .base import Problem

NAME = "math"

_NAMES = [("Ann", "she"), ("Ben", "he"), ("Cara", "she"), ("Dan", "he"), ("Eva", "she"), ("Finn", "he"),
          ("Gina", "she"), ("Hugo", "he"), ("Ivy", "she"), ("Jack", "he"), ("Lena", "she"), ("Max", "he"),
          ("Nora", "she"), ("Omar", "he"), ("Pia", "she"), ("Sam", "he")]
_OBJECTS = ["apples", "pens", "cards", "stickers", "books", "marbles", "cookies", "shells", "coins", "toys",
            "eggs", "stamps"]
_THINGS = ["food", "books", "games", "toys", "clothes", "tickets"]


def _eq(a: int, op: str, b: int, c: int) -> str:
    return f"{a} {op} {b} = {c}"


def make(rng: random.Random) -> Problem:
    t = rng.randrange(6)
    (a_name, pro), (b_name, _), (c_name, _) = rng.sample(_NAMES, 3)
    obj = rng.choice(_OBJECTS)
    P = pro.capitalize()
    if t == 0:
        a, b = rng.randint(2, 30), rng.randint(2, 30)
        s = a + b
        c = rng.randint(1, s - 1)
        r = s - c
        nums = (a, b, c)
        prompt = (f"{a_name} has {a} {obj}. {P} buys {b} more and then gives {c} to {b_name}. "
                  f"How many {obj} does {a_name} have now?")
        steps = [_eq(a, "+", b, s), _eq(s, "-", c, r)]
    elif t == 1:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        s = a * b
        c = rng.randint(1, s - 1)
        r = s - c
        nums = (a, b, c)
        prompt = (f"{a_name} buys {a} bags of {obj}. Each bag has {b} {obj}. {P} gives away {c} of them. "
                  f"How many {obj} are left?")
        steps = [_eq(a, "*", b, s), _eq(s, "-", c, r)]
    elif t == 2:
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        s = a + b
        r = a + s
        nums = (a, b)
        prompt = (f"{a_name} has {a} {obj}. {b_name} has {b} more {obj} than {a_name}. "
                  f"How many {obj} do they have together?")
        steps = [_eq(a, "+", b, s), _eq(a, "+", s, r)]
    elif t == 3:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        s = a * b
        c = rng.randint(1, s - 2)
        u = s - c
        d = rng.randint(1, u - 1)
        r = u - d
        t1, t2 = rng.sample(_THINGS, 2)
        nums = (a, b, c, d)
        prompt = (f"{a_name} earns {a} dollars a day for {b} days. {P} spends {c} dollars on {t1} and {d} "
                  f"dollars on {t2}. How many dollars does {a_name} have left?")
        steps = [_eq(a, "*", b, s), _eq(s, "-", c, u), _eq(u, "-", d, r)]
    elif t == 4:
        b, q = rng.randint(2, 9), rng.randint(2, 9)
        a = b * q
        c = rng.randint(1, 20)
        r = q + c
        nums = (a, b, c)
        prompt = (f"{a_name} has {a} {obj} and puts them into boxes of {b}. Then {pro} gets {c} more boxes. "
                  f"How many boxes does {a_name} have now?")
        steps = [_eq(a, "/", b, q), _eq(q, "+", c, r)]
    else:
        a, b = rng.randint(2, 12), rng.randint(2, 6)
        s = a * b
        c = rng.randint(1, s - 1)
        r = s - c
        nums = (a, b, c)
        prompt = (f"{a_name} has {a} {obj}. {b_name} has {b} times as many {obj} as {a_name}. {c_name} has "
                  f"{c} fewer {obj} than {b_name}. How many {obj} does {c_name} have?")
        steps = [_eq(a, "*", b, s), _eq(s, "-", c, r)]
    reference = "\n".join(steps + [f"answer: {r}"])
    return Problem(NAME, f"t{t}:" + ",".join(map(str, nums)), prompt, reference, {"answer": r})


_ANSWER = re.compile(r"answer:\s*(-?\d+)")


def score(problem: Problem, response: str) -> bool:
    found = _ANSWER.findall(response)
    return bool(found) and int(found[-1]) == int(problem.meta["answer"])
