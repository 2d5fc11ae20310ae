"""bench.head_hint: the first gate computes exactly the rows the host can count from the drafts (the
main block plus the draft positions whose token differs from the parent's) on every call; the growth
summary is ordered and starts at 1 (the deepest layers' maximum includes the first layer)."""
from bench.head_hint import main


def test_first_gate_matches_the_host_count(tmp_path):
    out = tmp_path / "hint.json"
    summary = main(["--limit", "1", "--tasks", "instruct", "--out", str(out)])
    assert summary["calls"] > 0 and summary["first_layer_differs"] == 0
    assert 1.0 <= summary["max_over_host_min"] <= summary["median"] <= summary["max"]
    assert out.is_file()
