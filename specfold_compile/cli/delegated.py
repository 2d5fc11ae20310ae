"""The commands whose parsers live with their code (``calibrate``, ``train``, ``eval``, ``sweep``), and
the checks ``specfold`` runs on their arguments before handing over: values, inputs and outputs, so a
user error is one line and status 2 before any work, as for the other commands."""

from __future__ import annotations

import argparse

from . import arguments

TARGETS = {
    "calibrate": "specfold_compile.decoding:calibrate_cli",
    "eval": "specfold_compile.cli.eval_commands:eval_cli",
    "sweep": "specfold_compile.cli.eval_commands:sweep_cli",
    "train": "specfold_compile.training:train_cli",
}


def _value(parse):
    """An argparse value type as a check: its error becomes ``argument FLAG: MESSAGE``, as argparse says it."""
    def check(text: str, flag: str) -> None:
        try:
            parse(text)
        except argparse.ArgumentTypeError as e:
            raise arguments.UsageError(f"argument {flag}: {e}") from None

    return check


def _train_device(text: str, flag: str) -> None:
    if text != "auto":
        _value(arguments.device)(text, flag)


_POSITIVE, _NONNEGATIVE = _value(arguments.positive_int), _value(arguments.nonnegative_int)

# flag -> check(value, flag), per command; eval and sweep check their own arguments.
CHECKS = {
    "calibrate": {"--model": arguments.model_config, "--prompts": arguments.input_file,
                  "--num-prompts": _POSITIVE, "--size": _POSITIVE, "--max-level": _POSITIVE,
                  "--max-rank": _POSITIVE, "--max-new-tokens": _POSITIVE,
                  "--threshold": _value(arguments.threshold), "--device": _value(arguments.device),
                  "--out": arguments.output_file, "--traces-out": arguments.output_file},
    "train": {"--out": arguments.output_dir, "--minutes": _value(arguments.positive_float),
              "--steps": _POSITIVE, "--vocab": _POSITIVE, "--batch-size": _POSITIVE,
              "--lr": _value(arguments.positive_float), "--warmup": _NONNEGATIVE, "--pool": _POSITIVE,
              "--eval-n": _POSITIVE, "--log-every": _POSITIVE, "--device": _train_device},
}


def check_arguments(command: str, rest: list[str]) -> None:
    """Check the arguments of ``rest`` that ``CHECKS`` lists for ``command`` (the command's own parser
    reports anything else, and ``--help`` skips the checks)."""
    checks = CHECKS.get(command, {})
    if not checks or "-h" in rest or "--help" in rest:
        return
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in checks:
        ap.add_argument(flag, default=None)
    known, _ = ap.parse_known_args(rest)
    for flag, check in checks.items():
        value = getattr(known, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            check(value, flag)
