import pytest

from specfold_compile.tasks import TASKS, get_task, sample, score, score_many, split_of


@pytest.mark.parametrize("task", TASKS)
def test_splits_disjoint_and_deterministic(task):
    train = sample(task, "train", 3000, seed=0)
    test = sample(task, "test", 50, seed=0)
    calib = sample(task, "calib", 50, seed=0)
    train_keys = {p.key for p in train}
    assert not train_keys & {p.key for p in test}
    assert not train_keys & {p.key for p in calib}
    assert not {p.key for p in test} & {p.key for p in calib}
    assert all(split_of(task, p.key) == "test" for p in test)
    assert len({p.key for p in test}) == 50  # held-out problems are unique
    assert [p.prompt for p in sample(task, "test", 50, seed=0)] == [p.prompt for p in test]
    assert [p.prompt for p in sample(task, "test", 50, seed=1)] != [p.prompt for p in test]


@pytest.mark.parametrize("task", TASKS)
def test_reference_scores_and_wrong_does_not(task):
    probs = sample(task, "test", 30, seed=3)
    assert all(score_many(probs, [p.reference for p in probs]))
    assert not any(score_many(probs, ["" for _ in probs]))


def test_math_checker():
    p = sample("math", "test", 1, seed=0)[0]
    ans = p.meta["answer"]
    assert score(p, f"1 + 1 = 2\nanswer: {ans}")
    assert not score(p, f"answer: {ans}\nanswer: {ans + 1}")  # the final answer counts
    assert not score(p, f"{ans}")


def test_instruct_checker():
    mod = get_task("instruct")
    p = next(q for q in sample("instruct", "test", 200, seed=0)
             if q.meta["distinct"] and q.meta["include"] and q.meta["case"] == "lowercase")
    words = p.reference.split(p.meta["sep"])
    assert mod.score(p, p.reference + "\n")
    assert not mod.score(p, p.meta["sep"].join(words[:-1]))  # wrong count
    assert not mod.score(p, p.meta["sep"].join([words[0]] * len(words)))  # repeats / maybe missing word
    assert not mod.score(p, p.reference.upper())  # case
    other = [w for w in mod.TOPICS[p.meta["topic"]] if w not in words]
    assert not mod.score(p, p.meta["sep"].join([w if w != p.meta["include"] else other[0] for w in words]))
    assert not mod.score(p, p.reference.replace(words[0], "zebra"))  # off-topic word


def test_code_checker_variants():
    p = next(q for q in sample("code", "test", 100, seed=0) if q.meta["entry"] == "f")
    assert score(p, p.reference)
    assert not score(p, "def f(*a):\n    return None\n")
    assert not score(p, "def f(:\n")  # syntax error
    assert not score(p, "raise SystemExit(0)\n")
