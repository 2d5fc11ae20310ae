"""Under Triton's CPU interpreter without the test patch (``specfold_compile.testing``), bf16 kernels that
multiply or store bf16 are refused with a clear error (the interpreter would return garbage), at compile
time too; the gate, float32, and a patched interpreter still run. In a subprocess: this process has the
patch installed (conftest)."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), reason="interpreter only")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent("""
    import sys, torch
    from specfold_compile import kernels as K
    from specfold_compile.kernels import interpreter_bf16
    from specfold_compile.ops.device_profile import H200
    from specfold_compile.models import build

    def refused(fn, what):
        try:
            fn()
        except RuntimeError as e:
            msg = str(e)
            assert msg.startswith(what + ": bf16 under Triton's CPU interpreter") and "\\n" not in msg, msg
            return
        raise AssertionError(what + " ran bf16 under the broken interpreter")

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, 32, generator=g), torch.randn(24, 32, generator=g)
    assert not interpreter_bf16.interpreter_bf16_ok()
    refused(lambda: K.packed_linear(x.bfloat16(), w.bfloat16(), None, None, min_block_r=64), "packed_linear")
    refused(lambda: K.silu_mul(x.bfloat16(), x.bfloat16()), "silu_mul")
    q = torch.randn(2, 4, 2, 16, generator=g).bfloat16(); kp = torch.randn(2, 5, 16, generator=g).bfloat16()
    refused(lambda: K.branch_attention(q, q, q, kp, kp, 0.25, tuning=H200.attention), "attention")
    torch.testing.assert_close(K.packed_linear(x, w, None, None, min_block_r=64), x @ w.t(), rtol=1e-5, atol=1e-5)  # fp32 runs
    h = torch.randn(3, 4, 8, generator=g).bfloat16(); parents = torch.tensor([-1, 0, 1])
    out, ref = K.fold_gate(h, parents, torch.tensor(0.5)), K.fold_gate_ref(h, parents, torch.tensor(0.5))
    assert all(torch.equal(a, b) for a, b in zip(out, ref))  # the gate only converts bf16 to fp32

    model = build("tiny-nld", seed=0, num_layers=1, block_size=8, dtype=torch.bfloat16)
    cache = model.prefill(torch.tensor([1, 2, 3]))
    tokens = torch.randint(0, 100, (2, 8), generator=g)
    try:
        torch.compile(model, backend="specfold", options={"kernels": "triton"})(tokens, torch.tensor([-1, 0]), cache)
        raise AssertionError("compiled with bf16 Triton kernels under the broken interpreter")
    except Exception as e:
        assert "options['kernels']='triton': bf16 under Triton's CPU interpreter" in str(e), str(e)

    from specfold_compile.testing import install_interpreter_bf16_patch
    install_interpreter_bf16_patch()
    interpreter_bf16.interpreter_bf16_ok.cache_clear()
    assert interpreter_bf16.interpreter_bf16_ok()
    y = K.packed_linear(x.bfloat16(), w.bfloat16(), None, None, min_block_r=64)
    torch.testing.assert_close(y.float(), (x.bfloat16().float() @ w.bfloat16().float().t()), rtol=2e-2, atol=2e-2)
    print("BF16_OK")
""")


def test_bf16_refused_under_the_unpatched_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    res = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and "BF16_OK" in res.stdout, res.stdout[-2000:] + res.stderr[-4000:]
