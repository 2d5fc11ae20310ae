"""Command-line argument checks that run before any work, and one-line reporting of user errors.

The ``specfold`` commands check every argument before they load a model: values (the argparse types
below), inputs (``--model``, ``--draft-graph``: read and validated, weights not loaded), outputs
(``output_file`` / ``output_dir``: the directory exists or is created, is not a file, and accepts a new
file) and optional packages (``require_module``). A failed check prints one line,
``specfold CMD: error: MESSAGE``, to stderr and exits with status 2, as argparse does for its own errors.

``reporting_user_errors`` does the same for a ``ValueError`` raised later by the library (a prompt too
long for the model, say), also when torch.compile wraps it; any other exception keeps its traceback,
and ``SPECFOLD_TRACEBACK=1`` shows the traceback of user errors too.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Iterator, NoReturn

import torch


class UsageError(ValueError):
    """A bad command-line argument; the message starts with the argument's name."""


def fail(prog: str, message: str) -> NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _user_error(exc: BaseException) -> ValueError | None:
    """The ValueError behind ``exc``: itself, or what torch.compile wrapped (``__cause__``,
    ``inner_exception``)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ValueError):
            return exc
        exc = getattr(exc, "inner_exception", None) or exc.__cause__
    return None


@contextlib.contextmanager
def reporting_user_errors(prog: str) -> Iterator[None]:
    """Inside it, a ValueError (possibly wrapped by torch.compile) ends the command with one line and
    status 2 (see the module docstring)."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is a user error
        user = _user_error(exc)
        if user is None or os.environ.get("SPECFOLD_TRACEBACK"):
            raise
        fail(prog, str(user).strip().splitlines()[0] if str(user).strip() else type(user).__name__)


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Warnings print as ``warning: MESSAGE`` (no source line), e.g. a config.json key taking a default."""
    previous = warnings.formatwarning
    warnings.formatwarning = lambda message, *_args, **_kwargs: f"warning: {message}\n"
    try:
        yield
    finally:
        warnings.formatwarning = previous


# --- argparse value types (argparse reports their errors as "argument --x: MESSAGE", status 2) ------

def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None


def int_at_least(low: int):
    def parse(text: str) -> int:
        value = _int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an int >= {low}, got {value}")
        return value

    parse.__name__ = f"int >= {low}"
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)


def _number_where(holds, expected: str, name: str):
    """An argparse type for a number for which ``holds(value)``; ``expected`` says which."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not holds(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    parse.__name__ = name
    return parse


positive_float = _number_where(lambda v: math.isfinite(v) and v > 0, "a finite number > 0", "positive_float")
threshold = _number_where(lambda v: 0.0 < v <= 1.0, "a number in (0, 1]", "threshold")  # a confidence threshold


def tau(text: str) -> float:
    """A fold threshold, as the backend accepts it (``SpecFoldSettings``)."""
    from ..backend.settings import SpecFoldSettings  # noqa: PLC0415

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    try:
        return SpecFoldSettings(tau=value).tau
    except (TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e).replace("options['tau']: ", "")) from None


def taus(text: str) -> list[float]:
    """A comma-separated list of fold thresholds."""
    values = [tau(x.strip()) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers >= 0, got {text!r}")
    return values


def nonnegative_ints(text: str) -> list[int]:
    values = [nonnegative_int(x.strip()) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints >= 0, got {text!r}")
    return values


def device(text: str) -> str:
    """A torch device that exists on this machine."""
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a torch device such as cpu, cuda or cuda:1, got {text!r}") \
            from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text!r}: no CUDA device is available here")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif dev.type not in ("cpu", "meta") and not getattr(torch, dev.type, None):
        raise argparse.ArgumentTypeError(f"{text!r}: this torch has no {dev.type} backend")
    return text


def names(allowed, what: str = "names"):
    """A comma-separated, non-empty subset of ``allowed``."""
    def parse(text: str) -> list[str]:
        out = [x.strip() for x in text.split(",") if x.strip()]
        if not out or any(x not in allowed for x in out):
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {list(allowed)}, got {text!r}")
        return out

    parse.__name__ = what
    return parse


# --- outputs, packages, inputs --------------------------------------------------------------------

def _check_writable_dir(path: Path, arg: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{arg}: {str(path)!r} is a file, expected a directory") from None
    except OSError as e:
        raise UsageError(f"{arg}: cannot create the directory {str(path)!r} ({e.strerror or e})") from None
    if not path.is_dir():
        raise UsageError(f"{arg}: {str(path)!r} is not a directory")
    try:  # the definitive test (permissions, read-only filesystems, quotas of inodes)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise UsageError(f"{arg}: cannot write in {str(path)!r} ({e.strerror or e})") from None


def output_file(path: str | os.PathLike, arg: str) -> Path:
    """Make sure ``path`` can be written: not a directory, an existing one writable, its directory
    existing (created here when missing) and writable. Returns it as a Path."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{arg}: {str(path)!r} is a directory, expected a file path")
    _check_writable_dir(path.parent if str(path.parent) else Path("."), arg)
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{arg}: {str(path)!r} exists and is not writable")
    return path


def output_dir(path: str | os.PathLike, arg: str) -> Path:
    """Make sure ``path`` is (or can be created as) a directory that accepts new files; created here."""
    path = Path(path)
    _check_writable_dir(path, arg)
    return path


def input_file(path: str | os.PathLike, arg: str) -> Path:
    """Make sure ``path`` is a file that can be read."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{arg}: {str(path)!r} is a directory, expected a file")
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise UsageError(f"{arg}: cannot read {str(path)!r} ({e.strerror or e})") from None
    return path


def require_module(module: str, purpose: str, extra: str, alternative: str = "") -> None:
    """``purpose`` needs the optional package ``module`` (installed with ``specfold-compile[extra]``)."""
    if importlib.util.find_spec(module) is None:
        raise UsageError(f"{purpose} needs {module} (pip install 'specfold-compile[{extra}]')"
                         f"{', or ' + alternative if alternative else ''}")


def model_config(spec: str | None, arg: str = "--model"):
    """The ModelConfig behind ``--model`` (a checkpoint directory's config.json, a preset, or the shipped
    model), read without loading weights."""
    from .. import models  # noqa: PLC0415
    from ..loading import DEFAULT_MODEL_DIR, default_model_available  # noqa: PLC0415

    if spec in (None, "default"):
        return models.read_config(DEFAULT_MODEL_DIR) if default_model_available() else models.PRESETS[
            "tiny-fast-dllm-v2"]
    if os.path.isdir(spec):
        try:
            return models.read_config(spec)
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(f"{arg}: {e}") from None
    if spec in models.PRESETS:
        return models.PRESETS[spec]
    if os.path.exists(spec):
        raise UsageError(f"{arg}: {spec!r} is a file; expected a checkpoint directory or a preset")
    raise UsageError(f"{arg}: {spec!r} is neither a checkpoint directory nor a preset; presets: "
                     f"{sorted(models.PRESETS)}")


def draft_graph(path: str | None, block_size: int, arg: str = "--draft-graph") -> None:
    """The draft graph file exists and is valid for the model's block size."""
    if path is None:
        return
    from ..decoding import load_draft_graph  # noqa: PLC0415

    try:
        load_draft_graph(path, block_size)
    except ValueError as e:
        raise UsageError(f"{arg}: {str(e).removeprefix('draft_graph: ')}") from None


def check_model_inputs(args) -> None:
    """Before anything loads, for the decoding commands: the model's config.json (weights untouched), the
    draft graph against its block size, and whether its chat template can be applied."""
    from ..loading import model_folder, prompt_style, resolve_draft_graph  # noqa: PLC0415

    cfg = model_config(args.model)
    draft_graph(resolve_draft_graph(args.model, args.draft_graph), cfg.block_size)
    try:
        prompt_style(model_folder(args.model), not args.no_chat_template)
    except ValueError as e:
        raise UsageError(f"--model: {e}") from None
