"""Test-only patch for Triton's CPU interpreter (triton 3.6).

The interpreter stores bf16 as raw uint16 bits; ``tl.dot`` on bf16 operands then multiplies the
bit patterns as integers, and fp32 -> bf16 casts truncate instead of rounding to nearest even.
``install()`` patches ``InterpreterBuilder`` so that:

* ``create_dot`` converts bf16 (and other non-numpy float) operands to float32 before the matmul;
* ``cast_impl`` / ``create_fp_to_fp`` route every bf16 <-> float conversion through torch, which
  rounds to nearest even (and handles subnormals, inf and NaN correctly).

Never install this from the package: it is configuration of the test environment only. Re-check it
when triton moves (the names patched here are internals).
"""
from __future__ import annotations

import numpy as np
import torch

_INSTALLED = False


def _bf16_bits_to_f32(data: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(data).view(np.int16)
    return torch.from_numpy(bits.copy()).view(torch.bfloat16).float().numpy()


def _to_bf16_bits(data: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(data))
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def install() -> bool:
    """Patch the interpreter once; return True if a patch is active."""
    global _INSTALLED
    if _INSTALLED:
        return True
    import triton.language as tl
    from triton.runtime import interpreter as interp

    builder_cls = interp.InterpreterBuilder
    TensorHandle = interp.TensorHandle
    orig_cast = builder_cls.cast_impl
    orig_fp_to_fp = builder_cls.create_fp_to_fp
    orig_dot = builder_cls.create_dot

    def _as_float(handle):
        """numpy float view of a float TensorHandle (bf16 decoded to fp32)."""
        if handle.dtype.scalar == tl.bfloat16:
            return _bf16_bits_to_f32(handle.data)
        return handle.data

    def _bf16_cast(src, dst_type):
        s, d = src.dtype.scalar, dst_type.scalar
        if s == tl.bfloat16 and d == tl.bfloat16:
            return TensorHandle(src.data.copy(), d)
        if s == tl.bfloat16:
            f = _bf16_bits_to_f32(src.data)
            if d.is_floating():
                return TensorHandle(f.astype(interp._get_np_dtype(d)), d)
            return TensorHandle(torch.from_numpy(f).to(_torch_int(d)).numpy(), d)
        # d == bf16
        data = src.data
        if data.dtype == np.uint16 or data.dtype == np.uint8:
            return None  # fp8 sources: leave to the original implementation
        f = data.astype(np.float32) if data.dtype != np.float64 else data
        return TensorHandle(_to_bf16_bits(f), d)

    def _torch_int(d):
        return {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[d.primitive_bitwidth]

    def cast_impl(self, src, dst_type):
        s, d = src.dtype.scalar, dst_type.scalar
        if s == tl.bfloat16 or d == tl.bfloat16:
            out = _bf16_cast(src, dst_type)
            if out is not None:
                return out
        return orig_cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        s, d = src.dtype.scalar, dst_type.scalar
        if (s == tl.bfloat16 or d == tl.bfloat16) and s.primitive_bitwidth >= 16 and d.primitive_bitwidth >= 16:
            out = _bf16_cast(src, dst_type)
            if out is not None:
                return out
        return orig_fp_to_fp(self, src, dst_type, rounding_mode)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            a_data = _as_float(a).astype(np.float32)
            b_data = _as_float(b).astype(np.float32)
            acc = d.data if d.dtype.scalar != tl.bfloat16 else _bf16_bits_to_f32(d.data)
            out = np.matmul(a_data, b_data, dtype=np.float32) + acc.astype(np.float32)
            if d.dtype.scalar == tl.bfloat16:
                return TensorHandle(_to_bf16_bits(out), d.dtype.scalar)
            return TensorHandle(out.astype(d.data.dtype), d.dtype.scalar)
        return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder_cls.cast_impl = cast_impl
    builder_cls.create_fp_ext = lambda self, src, dst_type: self.cast_impl(src, dst_type)
    builder_cls.create_fp_trunc = lambda self, src, dst_type: self.cast_impl(src, dst_type)
    builder_cls.create_si_to_fp = lambda self, src, dst_type: self.cast_impl(src, dst_type)
    builder_cls.create_ui_to_fp = lambda self, src, dst_type: self.cast_impl(src, dst_type)
    builder_cls.create_fp_to_si = lambda self, src, dst_type: self.cast_impl(src, dst_type)
    builder_cls.create_fp_to_ui = lambda self, src, dst_type: self.cast_impl(src, dst_type)
    builder_cls.create_fp_to_fp = create_fp_to_fp
    builder_cls.create_dot = create_dot
    _INSTALLED = True
    return True
