"""The code sandbox is a boundary: every escape probe fails inside it and works without it.

Each probe touches only a temp dir or a listener opened by the test. The same probe is run once with
``unsafe_run_code=True`` and no bubblewrap (a plain subprocess) to show that it would succeed without the
sandbox, so a failure inside the sandbox is the sandbox's doing.
"""

import ast
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specfold_compile.tasks import sample
from specfold_compile.tasks import sandbox
from specfold_compile.tasks.code_task import score
from specfold_compile.tasks.sandbox import SandboxUnavailable, run_candidate


def _unsafe(monkeypatch):
    """Make the sandbox unavailable, so ``unsafe_run_code=True`` runs the code without isolation."""
    monkeypatch.setattr(sandbox, "_bwrap", lambda: None)


def _run_unsafe(code, tests, **kw):
    with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
        res = run_candidate(code, "f", tests, unsafe_run_code=True, **kw)
    assert not res.sandboxed
    return res


def _values(res):
    assert res.status == "ok", res
    return [v if v.startswith("<error") else ast.literal_eval(v) for v in res.values]


_FILE_OPS = r'''
import os, shutil
def f(op, d):
    p = os.path.join(d, op + ".txt")
    try:
        if op == "read":
            return open(p).read()
        if op == "create":
            open(os.path.join(d, "new.txt"), "x").close()
        elif op == "write":
            open(p, "w").write("gone")
        elif op == "append":
            open(p, "a").write("more")
        elif op == "truncate":
            os.truncate(p, 0)
        elif op == "otrunc":
            os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))
        elif op == "rename":
            os.rename(p, os.path.join(d, "moved.txt"))
        elif op == "delete":
            os.remove(p)
        elif op == "chmod":
            os.chmod(p, 0o777)
        elif op == "rmtree":
            shutil.rmtree(os.path.join(d, "tree"))
        return "done"
    except OSError as e:
        return type(e).__name__
'''
_WRITE_OPS = ("create", "write", "append", "truncate", "otrunc", "rename", "delete", "chmod", "rmtree")


def _victim(root: Path) -> Path:
    root.mkdir()
    for op in ("read", *_WRITE_OPS):
        (root / f"{op}.txt").write_text("keep")
    (root / "tree").mkdir()
    (root / "tree" / "leaf.txt").write_text("keep")
    return root


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mode, p.read_text() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def test_no_file_outside_the_private_tmp_changes(tmp_path, monkeypatch):
    visible = _victim(tmp_path / "visible")  # bound read-only into the sandbox
    hidden = _victim(tmp_path / "hidden")  # not bound: not even visible
    before = _snapshot(visible), _snapshot(hidden)
    real_paths = sandbox._read_only_paths
    monkeypatch.setattr(sandbox, "_read_only_paths", lambda: [*real_paths(), str(visible)])
    tests = [[op, str(d)] for d in (visible, hidden) for op in ("read", *_WRITE_OPS)]
    values = _values(run_candidate(_FILE_OPS, "f", tests))
    assert values[0] == "keep"  # the visible dir is there, readable
    assert all(v in ("OSError", "PermissionError") for v in values[1:len(_WRITE_OPS) + 1]), values
    assert all(v == "FileNotFoundError" for v in values[len(_WRITE_OPS) + 1:]), values
    assert (_snapshot(visible), _snapshot(hidden)) == before

    control = _victim(tmp_path / "control")
    _unsafe(monkeypatch)
    values = _values(_run_unsafe(_FILE_OPS, [[op, str(control)] for op in _WRITE_OPS]))
    assert values == ["done"] * len(_WRITE_OPS)
    assert _snapshot(control) != _snapshot(hidden)


def test_only_the_private_tmp_is_writable():
    code = ("import os, sys\ndef f(d):\n    try:\n        open(os.path.join(d, 'probe'), 'w').write('x')\n"
            "        return 'written'\n    except OSError as e:\n        return type(e).__name__\n")
    dirs = ["/", "/usr", "/dev", "/dev/shm", "/proc", "/proc/sys/kernel", os.path.dirname(sys.executable),
            sys.base_prefix, "/tmp", "."]
    values = _values(run_candidate(code, "f", [[d] for d in dirs]))
    assert values[-2:] == ["written", "written"], values  # /tmp is the working directory
    assert "written" not in values[:-2], values


_CONNECT = r'''
import importlib, socket, _socket
def f(how, port, name):
    try:
        if how == "socket":
            socket.socket().connect(("127.0.0.1", port))
        elif how == "_socket":
            _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM).connect(("127.0.0.1", port))
        elif how == "reload":
            importlib.reload(socket).create_connection(("127.0.0.1", port), timeout=1)
        elif how == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.sendto(b"x", ("127.0.0.1", port))
            return "sent"
        elif how == "unix":
            socket.socket(socket.AF_UNIX).connect(name)
        return "connected"
    except OSError as e:
        return type(e).__name__
'''


def test_no_connection_reaches_the_test_listener(monkeypatch):
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    name = "\0specfold-sandbox-test-" + secrets.token_hex(8)  # abstract: tied to the network namespace
    unix.bind(name)
    unix.listen()
    for s in (tcp, udp, unix):
        s.setblocking(False)
    port, uport = tcp.getsockname()[1], udp.getsockname()[1]
    tests = [["socket", port, ""], ["_socket", port, ""], ["reload", port, ""], ["udp", uport, ""],
             ["unix", 0, name]]
    try:
        values = _values(run_candidate(_CONNECT, "f", tests))
        assert all(v.endswith("Error") for v in values[:3] + values[4:]), values
        for s in (tcp, unix):
            with pytest.raises(BlockingIOError):
                s.accept()
        with pytest.raises(BlockingIOError):
            udp.recv(16)

        _unsafe(monkeypatch)
        assert _values(_run_unsafe(_CONNECT, tests)) == ["connected"] * 3 + ["sent", "connected"]
        tcp.accept()[0].close()
    finally:
        for s in (tcp, udp, unix):
            s.close()


_KILL = r'''
import os, signal
def f(target, pid):
    try:
        if target == "parent":
            os.kill(os.getppid(), signal.SIGTERM)
        elif target == "victim":
            os.kill(pid, signal.SIGTERM)
        else:
            os.kill(pid, 0)  # does the process exist, as seen from here?
        return "sent"
    except OSError as e:
        return type(e).__name__
'''


def test_no_signal_reaches_the_evaluator(monkeypatch):
    received = []
    old = signal.signal(signal.SIGTERM, lambda *a: received.append(a))
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        values = _values(run_candidate(_KILL, "f", [["parent", 0], ["victim", victim.pid],
                                                    ["evaluator", os.getpid()]]))
        assert values == ["PermissionError", "ProcessLookupError", "ProcessLookupError"], values
        assert not received and victim.poll() is None

        _unsafe(monkeypatch)  # without the sandbox the same calls reach the evaluator and the victim
        assert _values(_run_unsafe(_KILL, [["victim", victim.pid], ["evaluator", os.getpid()]])) == ["sent"] * 2
        assert victim.wait(10) == -signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, old)
        victim.kill()
        victim.wait()


_ENVIRON = r'''
import os
def f(marker):
    found = [k for k, v in os.environ.items() if marker in v]
    for pid in sorted({"self", str(os.getppid()), *(p for p in os.listdir("/proc") if p.isdigit())}):
        try:
            with open("/proc/%s/environ" % pid, "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(pid)
        except OSError:
            pass
    return found
'''

_EVALUATOR = r'''
import importlib.util, json, sys, warnings
spec = importlib.util.spec_from_file_location("sandbox", sys.argv[1])
sandbox = sys.modules["sandbox"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
code, marker = sys.argv[2], sys.argv[3]
out = [sandbox.run_candidate(code, "f", [[marker]]).values]
sandbox._bwrap = lambda: None
warnings.simplefilter("ignore")
out.append(sandbox.run_candidate(code, "f", [[marker]], unsafe_run_code=True).values)
print(json.dumps(out))
'''


def test_the_evaluators_environment_is_hidden():
    """An evaluator process whose environment holds a marker: the candidate finds it nowhere (not in its
    environment, not in /proc/<ppid>/environ, not in any /proc/*/environ); without the sandbox it does."""
    marker = "specfold-marker-" + secrets.token_hex(8)
    proc = subprocess.run([sys.executable, "-c", _EVALUATOR, sandbox.__file__, _ENVIRON, marker],
                          env={**os.environ, "SPECFOLD_PROBE": marker}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    inside, outside = json.loads(proc.stdout)
    assert inside == ["[]"]
    assert outside != ["[]"] and outside is not None  # found in the evaluator's /proc/<pid>/environ


_FORK = r'''
import os, sys
def f(marker, hang):
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(30)", marker])
    while marker.encode() not in open("/proc/%d/cmdline" % pid, "rb").read():
        pass  # the child has exec'ed: it is a process of its own, in its own session
    while hang:
        pass
    return "forked"
'''


def _pids_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def test_no_process_outlives_the_run(monkeypatch):
    for hang in (False, True):
        marker = "specfold-orphan-" + secrets.token_hex(8)
        res = run_candidate(_FORK, "f", [[marker, hang]], timeout_s=1.0)
        assert res.status == ("timeout" if hang else "ok") and res.values in (None, ["'forked'"]), res
        assert _pids_with(marker) == []

    _unsafe(monkeypatch)  # without the sandbox the orphan survives (and is found by the same check)
    marker = "specfold-orphan-" + secrets.token_hex(8)
    assert _values(_run_unsafe(_FORK, [[marker, False]])) == ["forked"]
    orphans = _pids_with(marker)
    for pid in orphans:
        os.kill(pid, signal.SIGKILL)
    assert len(orphans) == 1


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_an_output_flood_is_cut_at_the_cap(stream):
    t0 = time.monotonic()
    code = f"import sys\ndef f():\n    while True:\n        sys.{stream}.write('x' * 2 ** 20)\n"
    res = run_candidate(code, "f", [[]], timeout_s=5.0, max_output_bytes=2**16)
    assert res.status == "output_limit" and res.values is None
    assert 2**16 < res.output_bytes <= 2**16 + 2**16  # at most one read past the cap
    assert time.monotonic() - t0 < 4  # killed at the cap, not at the timeout


def test_memory_cpu_and_wall_limits():
    bomb = "def f(n):\n    return len(bytearray(n))\n"
    assert run_candidate(bomb, "f", [[2**31], [2**10]]).values == ["<error MemoryError>", "1024"]
    res = run_candidate("x = []\nwhile True:\n    x.append(bytearray(2 ** 22))\n", "f", [[]], timeout_s=5.0,
                        memory_bytes=2**27)
    assert res.status == "error"  # MemoryError at the top level: the code did not run to the end
    forks = ("import os, time\ndef f():\n    for n in range(20):\n        try:\n            if os.fork() == 0:\n"
             "                time.sleep(30)\n        except OSError:\n            return n\n    return n\n")
    assert int(run_candidate(forks, "f", [[]], max_processes=4).values[0]) < 4  # also run as root
    t0 = time.monotonic()
    assert run_candidate("import time\ntime.sleep(60)\n", "f", [[]], timeout_s=1.0).status == "timeout"
    assert run_candidate("while True:\n    pass\n", "f", [[]], timeout_s=5.0, cpu_s=1).status == "crashed"
    assert time.monotonic() - t0 < 5


def test_honest_code_scores_as_before():
    assert run_candidate("def f(x):\n    return x * 2\n", "f", [[1], ["a"]]).values == ["2", "'aa'"]
    assert run_candidate("def g():\n    pass\n", "f", [[]]).status == "error"  # no entry
    probs = sample("code", "test", 6, seed=5)
    assert all(score(p, p.reference) for p in probs)
    assert not any(score(p, p.reference.replace("return ", "return 1 + ", 1)) for p in probs)
    assert not any(score(p, "def f(*a):\n    return None\n") for p in probs)


def test_refuses_without_a_sandbox(monkeypatch, tmp_path):
    p = sample("code", "test", 1, seed=0)[0]
    _unsafe(monkeypatch)
    for call in (lambda: run_candidate("def f():\n    return 1\n", "f", [[]]), lambda: score(p, p.reference)):
        with pytest.raises(SandboxUnavailable, match="bubblewrap.*--unsafe-run-code"):
            call()
    with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
        assert score(p, p.reference, unsafe_run_code=True)

    denied = tmp_path / "bwrap"  # a bwrap that cannot create namespaces
    denied.write_text("#!/bin/sh\necho 'bwrap: No permissions to create a new namespace' >&2\nexit 1\n")
    denied.chmod(0o755)
    monkeypatch.setattr(sandbox, "_bwrap", lambda: str(denied))
    with pytest.raises(SandboxUnavailable, match="No permissions to create a new namespace"):
        sandbox.require_sandbox()


def test_eval_refuses_code_before_loading_the_model(monkeypatch, capsys):
    from specfold_compile.cli import eval_commands

    _unsafe(monkeypatch)

    def no_load(*a, **k):
        raise AssertionError("loaded the model")

    monkeypatch.setattr(eval_commands, "load_model", no_load)
    for cli in (eval_commands.eval_cli, eval_commands.sweep_cli):
        with pytest.raises(SystemExit) as stop:  # a user error: one line, status 2
            cli(["--tasks", "math,code"])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.search(r"^specfold (eval|sweep): error: --tasks code: refusing .*--unsafe-run-code",
                                           err[0]), err
        with pytest.raises(AssertionError, match="loaded the model"):  # the flag (or no code task) passes
            cli(["--tasks", "code", "--unsafe-run-code"])
        with pytest.raises(AssertionError, match="loaded the model"):
            cli(["--tasks", "math"])


def test_unsafe_mode_still_has_the_limits(monkeypatch):
    _unsafe(monkeypatch)
    assert _run_unsafe("while True:\n    pass\n", [[]], timeout_s=1.0).status == "timeout"
    code = "import sys\nwhile True:\n    sys.stdout.write('x' * 2 ** 20)\n"
    assert _run_unsafe(code, [[]], max_output_bytes=2**16).status == "output_limit"
    assert _run_unsafe("def f():\n    return len(bytearray(2 ** 31))\n", [[]]).values == ["<error MemoryError>"]
