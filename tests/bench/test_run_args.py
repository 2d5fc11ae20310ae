"""bench.run's command line: a ratio filter that matches no target is an error, not an empty run."""
import json

import pytest

from bench import run


def test_unknown_ratio_is_an_error_naming_the_targets(capsys):
    with pytest.raises(SystemExit) as exc:
        run.main(["--suite", "per_check", "--cpu-dry-run", "--ratios", "0.1875"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--ratios" in err and "0.1875" in err and str(sorted(run.CHANGED_FOR_RATIO)) in err



def test_check_suite_counts_every_fold_op_with_its_impl(tmp_path, monkeypatch):
    """The check suite's op counts read each fold op's impl from its schema: every op of a folded
    layer is counted under "name[impl]" (CPU dry run: torch impls)."""
    monkeypatch.setenv("OUT", str(tmp_path))
    run.main(["--suite", "check", "--cpu-dry-run"])
    for row in json.loads((tmp_path / "check.json").read_text())["rows"]:
        for name in ("fold_gate", "packed_linear", "folded_attention", "packed_silu_mul"):
            assert row["graph_ops"].get(f"specfold::{name}[torch]", 0) > 0, row["graph_ops"]


def test_logit_fraction_per_check(tmp_path, monkeypatch, capsys):
    """--logit-fraction: every mode's rows carry it, and the floor counts the LM head on that many rows
    (lower where the FLOPs bound it, the same where the weight read does)."""
    monkeypatch.setenv("OUT", str(tmp_path))
    args = ["--suite", "per_check", "--cpu-dry-run", "--models", "fast-dllm-v2-1.5b", "--prefixes", "512", "--ns", "3",
            "--ratios", "0.25",
            "--no-inductor"]
    run.main(args + ["--logit-fraction", "0.5"])
    half = json.loads((tmp_path / "per_check.json").read_text())["rows"]
    run.main(args)
    full = json.loads((tmp_path / "per_check.json").read_text())["rows"]
    assert {r["mode"] for r in half} >= {"dense", "specfold", "floor"}
    assert all(r.get("logit_fraction") == 0.5 for r in half) and not any("logit_fraction" in r for r in full)
    floors = [(a["ms"], b["ms"]) for a, b in zip(half, full) if a["mode"] == "floor"]
    assert floors and all(a <= b for a, b in floors) and any(a < b for a, b in floors)
    for bad in (["0"], ["1.5"], ["half"], ["0.5", "--fold-head"]):
        with pytest.raises(SystemExit):
            run.main(args + ["--logit-fraction", *bad])
        assert "--logit-fraction" in capsys.readouterr().err
