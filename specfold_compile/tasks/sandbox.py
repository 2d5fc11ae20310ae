"""Run untrusted candidate code on test inputs in a separate, restricted process.

Isolation (reasonable, not a security boundary against a determined adversary):
- a fresh ``python -I`` (isolated mode: no user site, no PYTHON* env vars, no cwd on sys.path) with an
  empty environment, started in a fresh temporary directory that is deleted afterwards, in its own
  session so the timeout kills it;
- resource limits set by the child itself before it reads the candidate (no ``preexec_fn``, which is not
  thread-safe and we score from a thread pool): CPU seconds, address space (512 MiB), maximum file size 0
  (any write to a regular file fails), no new processes (RLIMIT_NPROC 0 where enforced), core dumps off;
- a prelude that replaces ``socket.socket`` / ``create_connection`` / ``socketpair`` with functions that
  raise (no network) and ``builtins.open`` / ``io.open`` with a read-only version (no file writes);
- a wall-clock timeout (default 2 s); a crash, an exception, a timeout or missing output is a failure.
Inputs go in over stdin as JSON; the results come back on stdout after a random per-run marker, as the
``repr`` of each return value (the expected values never enter the child process).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile

_PRELUDE = r'''
import resource
for _lim, _val in ((resource.RLIMIT_CPU, @CPU@), (resource.RLIMIT_AS, @MEM@), (resource.RLIMIT_FSIZE, 0),
                   (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, 0)):
    try:
        resource.setrlimit(_lim, (_val, _val))
    except (ValueError, OSError):
        if _lim != resource.RLIMIT_NPROC:
            raise
import builtins, io, json, socket, sys
_data = json.loads(sys.stdin.read())
def _no_net(*a, **k):
    raise PermissionError("network access is disabled")
socket.socket = _no_net
socket.create_connection = _no_net
socket.socketpair = _no_net
_real_open = builtins.open
def _read_only_open(file, mode="r", *a, **k):
    if any(c in mode for c in "wax+"):
        raise PermissionError("file writes are disabled")
    return _real_open(file, mode, *a, **k)
builtins.open = _read_only_open
io.open = _read_only_open
_out = []
try:
    _ns = {"__name__": "candidate"}
    exec(compile(_data["code"], "<candidate>", "exec"), _ns)
    _f = _ns[_data["entry"]]
    for _args in _data["tests"]:
        try:
            _out.append(repr(_f(*_args)))
        except Exception as _e:
            _out.append("<error %s>" % type(_e).__name__)
except BaseException as _e:
    _out = None
sys.stdout.write(_data["marker"] + json.dumps(_out))
sys.stdout.flush()
'''


def run_function(code: str, entry: str, tests: list, timeout: float = 2.0, cpu_seconds: int = 2,
                 mem_bytes: int = 512 * 2**20) -> list[str] | None:
    """Run ``entry(*args)`` for every args in ``tests``; returns the repr of each result (an
    ``<error Name>`` string where the call raised) or None if the code did not run to the end."""
    marker = "@@RESULT-" + secrets.token_hex(8) + "@@"
    payload = json.dumps({"code": code, "entry": entry, "tests": tests, "marker": marker})
    with tempfile.TemporaryDirectory(prefix="specfold-sandbox-") as tmp:
        try:
            prelude = _PRELUDE.replace("@CPU@", str(int(cpu_seconds))).replace("@MEM@", str(int(mem_bytes)))
            proc = subprocess.run([sys.executable, "-I", "-S", "-c", prelude], input=payload.encode(),
                                  capture_output=True, timeout=timeout, cwd=tmp, env={}, start_new_session=True)
        except subprocess.TimeoutExpired:
            return None
        except OSError:
            return None
    out = proc.stdout.decode(errors="replace")
    if proc.returncode != 0 or marker not in out:
        return None
    try:
        result = json.loads(out.rsplit(marker, 1)[1])
    except ValueError:
        return None
    if not isinstance(result, list) or len(result) != len(tests):
        return None
    return [str(r) for r in result]
