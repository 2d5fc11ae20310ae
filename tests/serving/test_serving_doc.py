"""docs/serving.md's examples run as written and print what the page says."""
import contextlib
import io
import re
from pathlib import Path

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()


def test_serving_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", PAGE, flags=re.S)
    assert len(blocks) == 4
    out = io.StringIO()
    scope: dict = {}
    with contextlib.redirect_stdout(out):
        for block in blocks:
            exec(compile(block, "serving.md", "exec"), scope)
    lines = out.getvalue().splitlines()
    assert lines[0] == "[True, True, True]"
    engine, a, b = scope["engine"], scope["a"], scope["b"]
    assert engine.output(a).status == engine.output(b).status == "finished"
    assert len(lines) == 1 + engine.output(a).result.blocks + engine.output(b).result.blocks + 1 + 3
    assert engine.pool.free_slots == 4
    folding = scope["folding"]
    assert lines[-3:-1] == ["[True, True, True]", "True"]
    assert lines[-1] == f"recompute ratio {folding.stats.recompute_ratio:.2f}"
    assert 0 < folding.stats.recompute_ratio < 1 and folding.stats.folded_draft_positions > 0
    shares, served = scope["shares"], scope["served"]
    assert len(shares) == len(engine.model.layers) and all(0 < x <= 1 for x in shares)
    assert served.graphs.fold_capacity == shares
