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
