"""bench.run's command line: a ratio filter that matches no target is an error, not an empty run."""
import pytest

from bench import run


def test_unknown_ratio_is_an_error_naming_the_targets(capsys):
    with pytest.raises(SystemExit) as exc:
        run.main(["--suite", "per_check", "--cpu-dry-run", "--ratios", "0.1875"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--ratios" in err and "0.1875" in err and str(sorted(run.CHANGED_FOR_RATIO)) in err
