"""Every kernel benchmark runs its --quick smoke mode on the CPU (Triton interpreter) and writes rows:
the harness must set the interpreter up before triton is imported, or no kernel launches at all."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script, extra", [
    ("check_all.py", []), ("bench_attention.py", []), ("bench_attention.py", ["--sweep"]),
    ("bench_swiglu.py", []), ("bench_swiglu.py", ["--sweep"]), ("bench_gate.py", []), ("bench_gate.py", ["--flag-sweep"]),
    ("bench_gate.py", ["--serving"]),
    ("bench_packed_linear.py", []),
    ("bench_ragged_attention.py", []),
    ("bench_folded_ragged_attention.py", []),
])
def test_kernel_benchmark_quick(script, extra, tmp_path):
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "kernels" / script), "--quick", "--out", str(out),
                           *extra], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["results"]
    assert rows and all(r.get("max_rel_err", 0.0) < 0.05 and r.get("mismatches", 0) == 0 for r in rows)


@pytest.mark.parametrize("script", ["bench_cublas_gemm.py", "bench_cublas_variants.py", "bench_count_gemm.py"])
def test_cublas_benchmarks_refuse_the_cpu(script, tmp_path):
    """The cuBLAS benchmarks time the GPU's library only: without CUDA they stop with a message naming
    themselves, and write nothing."""
    if __import__("torch").cuda.is_available():
        pytest.skip("a GPU is present")
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "kernels" / script), "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and script.removesuffix(".py") in proc.stderr and "CUDA" in proc.stderr
    assert not out.exists()
