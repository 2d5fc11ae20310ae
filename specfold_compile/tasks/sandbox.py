"""Run untrusted candidate code on test inputs inside an OS-level sandbox (bubblewrap).

API::

    run_candidate(code, entry, tests, *, timeout_s=2.0, unsafe_run_code=False, ...) -> Result
    require_sandbox()        # raises SandboxUnavailable (naming the reason) where no sandbox can be built
    SandboxUnavailable       # a RuntimeError

``run_candidate`` runs ``code``, then ``entry(*args)`` for every ``args`` in ``tests``, in a fresh
``sys.executable -I -S`` and returns a ``Result``: ``status`` ("ok", "error": the code did not compile,
raised at the top level or has no ``entry``; "timeout", "output_limit", "crashed"), ``values`` (the
``repr`` of each return value, ``"<error Name>"`` where a call raised; None unless "ok"), ``sandboxed``
and ``output_bytes``. The expected values never enter the sandbox; the caller compares ``values``.

The boundary is bubblewrap (``bwrap``, Debian package ``bubblewrap``), the kernel's namespaces:
- a new network namespace: only its own loopback, which reaches nothing outside the sandbox;
- a new PID namespace: no process outside is visible or can be signalled; when the candidate's process
  exits or the timeout hits, the namespace's init is killed and with it every descendant;
- a new mount namespace whose root is read-only: ``/usr`` (and its ``/bin``, ``/lib`` links) and the
  interpreter's prefixes bound read-only, a fresh ``/dev`` and a ``/proc`` of the new PID namespace only
  (no view of the evaluator's processes); the only writable place is a private, size-capped tmpfs at
  ``/tmp`` (the working directory), gone when the run ends;
- new IPC and UTS namespaces, a new session (no terminal), an empty environment (bwrap itself starts
  with one, so even the namespace's init holds none of the evaluator's variables);
- resource limits set before the candidate is read, which it cannot raise: address space
  (``memory_bytes`` per process), CPU seconds, ``max_processes`` processes and threads, no core dumps.
  Run as root, the sandbox first switches to an unused uid (no capabilities, and the process limit is
  enforced: the kernel does not enforce it for root); the payload file stays readable only by root;
- ``max_output_bytes``: the evaluator reads at most that much of stdout plus stderr, then kills the
  sandbox ("output_limit"), so a flood cannot grow its memory; the wall-clock ``timeout_s`` kills it too.

Where no sandbox can be built (``bwrap`` missing, namespaces denied), ``run_candidate`` raises
``SandboxUnavailable`` unless ``unsafe_run_code=True`` (``specfold eval --unsafe-run-code``): then the
candidate runs in a plain subprocess with the same resource limits (the process limit is not enforced for
root), empty environment, timeout and output cap, but as the invoking user with full access to its files,
network and processes, and a process that leaves the child's process group survives: no boundary at all.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

__all__ = ["Result", "SandboxUnavailable", "require_sandbox", "run_candidate"]

STATUSES = ("ok", "error", "timeout", "output_limit", "crashed")
_STDERR_KEEP = 4096  # bytes of stderr kept for diagnostics
_TMP_BYTES = 16 * 2**20  # size of the sandbox's writable tmpfs
_INSIDE_PAYLOAD = "/payload.json"

# Runs first in the child: limits, then (as root) an unused uid, then the candidate. The payload is read
# before the uid switch; afterwards nothing the candidate does can undo the limits.
_PRELUDE = r'''
import json, os, resource, sys
with open(sys.argv[1], "rb") as _fh:
    _data = json.loads(_fh.read())
del _fh
for _lim, _soft, _hard in ((resource.RLIMIT_AS, _data["memory_bytes"], _data["memory_bytes"]),
                           (resource.RLIMIT_CPU, _data["cpu_s"], _data["cpu_s"] + 1),
                           (resource.RLIMIT_NPROC, _data["max_processes"], _data["max_processes"]),
                           (resource.RLIMIT_CORE, 0, 0)):
    resource.setrlimit(_lim, (_soft, _hard))
if _data["uid"] is not None:
    _id = _data["uid"]
    os.setgroups([])
    os.setresgid(_id, _id, _id)
    os.setresuid(_id, _id, _id)
    if os.getresuid() != (_id, _id, _id) or os.getresgid() != (_id, _id, _id):
        os._exit(3)
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
except BaseException:
    _out = None
sys.stdout.write(_data["marker"] + json.dumps(_out))
sys.stdout.flush()
'''


class SandboxUnavailable(RuntimeError):
    """No OS-level sandbox can be built here; candidate code is refused unless explicitly allowed."""


@dataclass(frozen=True)
class Result:
    status: str  # one of STATUSES
    values: list[str] | None  # repr per test (or "<error Name>"); None unless status == "ok"
    sandboxed: bool  # False only for an unsafe_run_code run without bubblewrap
    output_bytes: int  # stdout + stderr bytes read from the child (at most max_output_bytes + one read)
    detail: str = ""  # the start of stderr, for diagnostics


def _bwrap() -> str | None:
    return shutil.which("bwrap")


def _interpreter_paths() -> list[str]:
    """Directories the interpreter needs (binary, stdlib, libpython), outermost first, deduplicated."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.abspath(sys.executable)), os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(os.path.abspath(p) for p in paths if p)


def _read_only_paths() -> list[str]:
    """Host directories bound read-only at the same path (besides the /bin, /lib links of a merged /usr)."""
    return ["/usr", *_interpreter_paths()]


def _ancestors(path: str) -> list[str]:
    out = []
    while (path := os.path.dirname(path)) != "/":
        out.append(path)
    return out


def _bwrap_args(bwrap: str, payload: str, info_fd: int, as_root: bool) -> list[str]:
    args = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL"]
    if as_root:  # only to switch to the unused uid; the switch clears every capability
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    args += ["--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--size", str(_TMP_BYTES), "--tmpfs", "/tmp"]
    binds: list[str] = []
    for path in sorted(_read_only_paths()):  # a parent sorts before its children
        if not any(path == b or path.startswith(b.rstrip("/") + "/") for b in binds):
            binds.append(path)
    # bwrap would create the directories above a bind 0700, closed to the sandbox's uid
    for parent in sorted({a for p in binds for a in _ancestors(p)} - {*binds, "/dev", "/proc", "/tmp"}):
        args += ["--perms", "0755", "--dir", parent]
    for path in binds:
        args += ["--ro-bind", path, path]
    for link in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    return args + ["--ro-bind", payload, _INSIDE_PAYLOAD, "--remount-ro", "/", "--chdir", "/tmp",
                   "--info-fd", str(info_fd)]


def _unused_id() -> int:
    return 2**20 + secrets.randbelow(2**29)  # far above any account's uid/gid


@dataclass
class _Run:
    stdout: bytearray
    stderr: bytearray
    status: str  # "" while running
    returncode: int | None
    output_bytes: int = 0


def _kill(proc: subprocess.Popen, init_pidfd: int | None, sandboxed: bool) -> None:
    """Kill the whole sandbox: its namespace's init (the kernel then kills every process in the
    namespace before the init is reaped), else bwrap (--die-with-parent takes the init with it). An
    unsandboxed child: its process group (a process that left the group survives: no boundary)."""
    try:
        if init_pidfd is not None:
            signal.pidfd_send_signal(init_pidfd, signal.SIGKILL)
        if sandboxed:
            proc.kill()
        else:
            os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _pidfd(pid: int, parent: int | None = None) -> int | None:
    """A pidfd of ``pid`` (None where pidfds are unsupported); with ``parent``, only if that is its parent
    (the sandbox's init, from bwrap's --info-fd, is bwrap's child)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    if parent is not None:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            ppid = -1
        if ppid != parent:
            os.close(fd)
            return None
    return fd


def _init_pid(info: bytes) -> int | None:
    try:
        return int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def _communicate(proc: subprocess.Popen, info_r: int | None, deadline: float, max_output: int,
                 sandboxed: bool) -> _Run:
    """Read stdout / stderr (and bwrap's info pipe) until the child has exited and the pipes hold nothing
    more, the deadline or the output cap; then kill what is left.

    Sandboxed, "exited" is the exit of the namespace's init, not of bwrap (which exits as soon as the
    candidate's process does): the init exits only once the kernel has killed every process in its
    namespace, so when this returns none is left."""
    run = _Run(bytearray(), bytearray(), "", None)
    info = bytearray()
    init_pidfd = None
    exit_fd = _pidfd(proc.pid)  # readable once the child exits: an orphan holding the pipes cannot stall us
    sel = selectors.DefaultSelector()
    for fd, what in ((proc.stdout.fileno(), "stdout"), (proc.stderr.fileno(), "stderr"), (info_r, "info"),
                     (exit_fd, "exit")):
        if fd is not None:
            sel.register(fd, selectors.EVENT_READ, what)
    exited = False
    try:
        while not run.status and sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                run.status = "timeout"
                break
            events = sel.select(0 if exited else left)
            if exited and not events:
                break
            for key, _ in events:
                if key.data == "exit":
                    exited = True
                    sel.unregister(key.fd)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    if key.data == "info" and (pid := _init_pid(bytes(info))) is not None:
                        init_pidfd = _pidfd(pid, parent=proc.pid)
                        if init_pidfd is not None and not exited:
                            if exit_fd is not None:
                                sel.unregister(exit_fd)
                            sel.register(init_pidfd, selectors.EVENT_READ, "exit")
                elif key.data == "info":
                    info += chunk[:4096]
                else:
                    run.output_bytes += len(chunk)
                    if run.output_bytes > max_output:
                        run.status = "output_limit"
                        break
                    if key.data == "stdout":
                        run.stdout += chunk
                    elif len(run.stderr) < _STDERR_KEEP:
                        run.stderr += chunk[:_STDERR_KEEP - len(run.stderr)]
        if run.status or not sandboxed:  # unsandboxed: the child's group too, before the child is reaped
            _kill(proc, init_pidfd, sandboxed)
        if init_pidfd is not None:
            select.select([init_pidfd], [], [], 10.0)
        run.returncode = proc.wait()
    finally:
        sel.close()
        for fd in (init_pidfd, exit_fd):
            if fd is not None:
                os.close(fd)
    return run


def _launch(code: str, entry: str, tests: list, *, timeout_s: float, cpu_s: int, memory_bytes: int,
            max_processes: int, max_output_bytes: int, bwrap: str | None) -> Result:
    marker = "@@RESULT-" + secrets.token_hex(8) + "@@"
    as_root = os.geteuid() == 0
    uid = _unused_id() if (bwrap is not None and as_root) else None
    payload = {"code": code, "entry": entry, "tests": tests, "marker": marker, "cpu_s": int(cpu_s),
               "memory_bytes": int(memory_bytes), "max_processes": int(max_processes), "uid": uid}
    with tempfile.TemporaryDirectory(prefix="specfold-sandbox-") as host_tmp:
        path = os.path.join(host_tmp, "payload.json")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
            json.dump(payload, fh)
        info_r = info_w = None
        if bwrap is not None:
            info_r, info_w = os.pipe()
            cmd = _bwrap_args(bwrap, path, info_w, as_root) + [sys.executable, "-I", "-S", "-c", _PRELUDE,
                                                                _INSIDE_PAYLOAD]
            kw = {"pass_fds": (info_w,)}
        else:
            cmd = [sys.executable, "-I", "-S", "-c", _PRELUDE, path]
            kw = {"cwd": host_tmp}
        deadline = time.monotonic() + timeout_s
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env={}, start_new_session=True, **kw)
        except OSError as e:
            return Result("crashed", None, bwrap is not None, 0, f"could not start: {e}")
        finally:
            if info_w is not None:
                os.close(info_w)
        try:
            with proc:
                run = _communicate(proc, info_r, deadline, max_output_bytes, bwrap is not None)
        finally:
            if info_r is not None:
                os.close(info_r)
    detail = run.stderr.decode(errors="replace").strip()
    sandboxed = bwrap is not None
    if run.status:
        return Result(run.status, None, sandboxed, run.output_bytes, detail)
    out = run.stdout.decode(errors="replace")
    if run.returncode != 0 or marker not in out:
        return Result("crashed", None, sandboxed, run.output_bytes, detail or f"exit status {run.returncode}")
    try:
        values = json.loads(out.rsplit(marker, 1)[1])
    except ValueError:
        return Result("crashed", None, sandboxed, run.output_bytes, "unreadable result")
    if values is None:
        return Result("error", None, sandboxed, run.output_bytes, detail)
    if not isinstance(values, list) or len(values) != len(tests) or not all(isinstance(v, str) for v in values):
        return Result("crashed", None, sandboxed, run.output_bytes, "malformed result")
    return Result("ok", values, sandboxed, run.output_bytes, detail)


_PROBE_LIMITS = {"timeout_s": 5.0, "cpu_s": 2, "memory_bytes": 512 * 2**20, "max_processes": 8,
           "max_output_bytes": 2**16}


@functools.lru_cache(maxsize=None)
def _probe(bwrap: str | None) -> str | None:
    """Why no sandbox can be built with ``bwrap`` (None: it works): a trivial candidate must run in it."""
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    res = _launch("def f():\n    return 1\n", "f", [[]], bwrap=bwrap, **_PROBE_LIMITS)
    if res.status == "ok" and res.values == ["1"]:
        return None
    first = res.detail.splitlines()[0] if res.detail else res.status
    return f"bubblewrap cannot build the sandbox here ({first})"


def require_sandbox() -> None:
    """Raise ``SandboxUnavailable`` (naming why and how to proceed) where no sandbox can be built."""
    reason = _probe(_bwrap())
    if reason is not None:
        raise SandboxUnavailable(
            f"refusing to run model-generated code: {reason}. Install bubblewrap (Debian/Ubuntu: "
            "apt-get install bubblewrap), or accept the risk with --unsafe-run-code (unsafe_run_code=True), "
            "which runs it without isolation, as the invoking user")


def run_candidate(code: str, entry: str, tests: list, *, timeout_s: float = 2.0, cpu_s: int = 2,
                  memory_bytes: int = 512 * 2**20, max_processes: int = 8, max_output_bytes: int = 2**16,
                  unsafe_run_code: bool = False) -> Result:
    """Run ``code`` and ``entry(*args)`` for every ``args`` in ``tests`` (JSON values) in the sandbox.

    Raises ``SandboxUnavailable`` where no sandbox can be built, unless ``unsafe_run_code`` (then the code
    runs unsandboxed, with a warning, and ``Result.sandboxed`` is False)."""
    bwrap = _bwrap()
    if _probe(bwrap) is not None:
        if not unsafe_run_code:
            require_sandbox()
        warnings.warn(f"running model-generated code WITHOUT a sandbox (--unsafe-run-code): {_probe(bwrap)}",
                      RuntimeWarning, stacklevel=2)
        bwrap = None
    return _launch(code, entry, tests, timeout_s=timeout_s, cpu_s=cpu_s, memory_bytes=memory_bytes,
                   max_processes=max_processes, max_output_bytes=max_output_bytes, bwrap=bwrap)
