"""IFEval-like instruction following over a small vocabulary.

Prompt: "Write N words about TOPIC in CASE, separated by 'SEP'." plus optional "Include the word 'W'." and
"Do not repeat any word." The checker verifies every constraint exactly: the response (ends stripped of
whitespace) split on SEP gives exactly N parts, each a topic word written in the required case, W among
them when asked, all distinct when asked.
"""

from __future__ import annotations

import random

from .base import Problem

NAME = "instruct"

TOPICS: dict[str, tuple[str, ...]] = {
    "animals": ("cat", "dog", "horse", "cow", "lion", "tiger", "bear", "wolf", "fox", "rabbit", "sheep", "goat"),
    "fruits": ("apple", "pear", "banana", "cherry", "grape", "lemon", "mango", "peach", "plum", "melon", "kiwi",
               "orange"),
    "colors": ("red", "blue", "green", "yellow", "purple", "black", "white", "brown", "pink", "gray", "gold",
               "silver"),
    "sports": ("soccer", "tennis", "golf", "hockey", "rugby", "boxing", "rowing", "skiing", "cycling", "running",
               "swimming", "karate"),
    "weather": ("rain", "snow", "wind", "storm", "cloud", "fog", "sun", "hail", "thunder", "frost", "mist",
                "heat"),
    "music": ("piano", "guitar", "drum", "violin", "flute", "song", "melody", "rhythm", "choir", "band", "harp",
              "trumpet"),
    "ocean": ("wave", "shark", "whale", "coral", "reef", "tide", "sand", "salt", "fish", "crab", "boat",
              "island"),
    "space": ("star", "moon", "planet", "comet", "galaxy", "orbit", "rocket", "nebula", "meteor", "asteroid",
              "cosmos", "mars"),
    "kitchen": ("pot", "pan", "knife", "spoon", "fork", "oven", "plate", "bowl", "kettle", "stove", "cup",
                "sink"),
    "school": ("teacher", "pupil", "desk", "chalk", "book", "lesson", "exam", "pencil", "class", "homework",
               "library", "ruler"),
}
CASES = {"lowercase": str.lower, "all capital letters": str.upper, "title case": str.capitalize}
SEPARATORS = (" | ", ", ", " - ", " / ", "; ")


def make(rng: random.Random) -> Problem:
    topic = rng.choice(sorted(TOPICS))
    n = rng.randint(3, 7)
    case = rng.choice(sorted(CASES))
    sep = rng.choice(SEPARATORS)
    include = rng.choice(TOPICS[topic]) if rng.random() < 0.5 else None
    distinct = rng.random() < 0.5
    prompt = f"Write {n} words about {topic} in {case}, separated by '{sep}'."
    if include:
        prompt += f" Include the word '{include}'."
    if distinct:
        prompt += " Do not repeat any word."
    pool = [w for w in TOPICS[topic] if w != include]
    words = rng.sample(pool, n - 1 if include else n)
    if include:
        words.insert(rng.randrange(len(words) + 1), include)
    reference = sep.join(CASES[case](w) for w in words)
    key = f"{topic}|{n}|{case}|{sep}|{include}|{distinct}"
    meta = {"topic": topic, "n": n, "case": case, "sep": sep, "include": include, "distinct": distinct}
    return Problem(NAME, key, prompt, reference, meta)


def score(problem: Problem, response: str) -> bool:
    m = problem.meta
    parts = response.strip().split(m["sep"])
    if len(parts) != m["n"]:
        return False
    fmt = CASES[m["case"]]
    vocab = TOPICS[m["topic"]]
    for w in parts:
        if not w.isalpha() or w.lower() not in vocab or w != fmt(w.lower()):
            return False
    lowered = [w.lower() for w in parts]
    if m["include"] and m["include"] not in lowered:
        return False
    if m["distinct"] and len(set(lowered)) != len(lowered):
        return False
    return True
