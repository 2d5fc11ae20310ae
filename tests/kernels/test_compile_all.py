"""bench/kernels/compile_all.py: every kernel's GPU launches at the real shapes compile for sm_90 (the H100
and H200) and fit its shared memory, checked on the CPU by Triton's compiler and ptxas; the interpreter
that runs the other kernel tests lowers nothing for a GPU."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "specfold_compile" / "kernels"
# launched only under the interpreter: the probe of its bf16 arithmetic
INTERPRETER_ONLY = {"_bf16_probe_kernel"}


def _compile_all(tmp_path, *args):
    out = tmp_path / f"compile_all_{len(list(tmp_path.iterdir()))}.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "bench/kernels/compile_all.py", "--out", str(out), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def _launched_kernels() -> set[str]:
    """The @triton.jit functions of the kernels package that are launched, not called from other kernels."""
    jitted, called = set(), set()
    for path in KERNELS.glob("*.py"):
        tree = ast.parse(path.read_text())
        for fn in tree.body:
            if isinstance(fn, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in fn.decorator_list):
                jitted.add(fn.name)
                called |= {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return jitted - called - INTERPRETER_ONLY


def _nvidia_backend() -> bool:
    try:
        from triton.backends import backends
    except Exception:
        return False
    return "nvidia" in backends


@pytest.mark.skipif(not _nvidia_backend(), reason="needs Triton's NVIDIA backend (ptxas ships with the wheel)")
def test_every_kernel_compiles_for_sm90_within_shared_memory(tmp_path):
    proc, res = _compile_all(tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = res["rows"]
    assert res["arch"] == 90 and res["shared_limit"] == 227 * 1024
    assert all(r["ok"] and 0 <= r["shared_bytes"] <= res["shared_limit"] for r in rows)
    launched = _launched_kernels()
    assert len(launched) >= 8, launched  # the gate's two, attention's two, ragged, packed prefix, linear, SwiGLU
    assert launched <= {r["kernel"] for r in rows}, launched - {r["kernel"] for r in rows}
    # the packed linear's autotuner: every config it may pick compiled
    assert len({(r["constexprs"]["BLOCK_R"], r["constexprs"]["BLOCK_N"], r["num_warps"])
                for r in rows if r["kernel"] == "_packed_linear_body"}) >= 5

    # the same launches (compiled already, from Triton's cache) under a smaller limit: each launch over it
    # fails the check, and only those
    limit = 64 * 1024
    proc, small = _compile_all(tmp_path, "--models", "fastdllm-1.5b", "--shared-limit", str(limit))
    assert proc.returncode == 1
    assert any(r["shared_bytes"] > limit for r in small["rows"])
    assert all(r["ok"] == (r["shared_bytes"] <= limit) for r in small["rows"])
    assert all(r["error"] is None if r["ok"] else r["error"].startswith("shared memory") for r in small["rows"])
