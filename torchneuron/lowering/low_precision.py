"""Lowerings: float8 casts as PyTorch's CPU kernels make them, and `torch._scaled_mm`.

PyTorch converts every value to and from a float8 format through float32 (c10's
`fp8*_from_fp32_value`; a double or an integer is first rounded to float32), with rules of its
own where XLA's `convert` differs:

- float8_e4m3fn saturates: a finite value past its largest (448) and +-inf become +-448, where XLA
  gives NaN;
- float8_e4m3fn and float8_e5m2 keep a NaN's sign and give the NaN with every mantissa bit set;
- float8_e8m0fnu (a power of two, no sign, no zero) takes the exponent of |x| rounded to nearest
  on the mantissa, 0 becoming 2**-127 (byte 0), where XLA gives NaN for 0 and negative values;
- the fnuz formats have no -0: a negative value that rounds to zero is +0;
- NaNs read as float32 carry c10's payload bits.

Everything else (rounding of finite values, subnormals, the fnuz formats) XLA does as CPU does;
tests/eager/test_low_precision.py compares every float8 byte and a sweep of float32 bit patterns.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..runtime.dtypes import FLOAT8, to_jax
from . import aten, lowers

_F32, _F64, _E8M0 = np.dtype(jnp.float32), np.dtype(jnp.float64), np.dtype(jnp.float8_e8m0fnu)
_FLOAT8 = frozenset(np.dtype(to_jax(d)) for d in FLOAT8)


def _byte(x):
    return lax.bitcast_convert_type(x, jnp.uint8)


def _word(x):
    return lax.bitcast_convert_type(x, jnp.uint32)


def _signed_nan(x, dtype, saturate=None):
    """float32 `x` in an IEEE-like float8 `dtype` (e4m3fn, e5m2) as c10 converts it: NaN keeps the
    sign with all mantissa bits set, and with `saturate` a finite overflow or an infinity becomes
    the largest finite value of its sign."""
    converted = (x if saturate is None else jnp.clip(x, -saturate, saturate)).astype(dtype)
    sign = (_word(x) >> 24).astype(jnp.uint8) & 0x80
    return lax.bitcast_convert_type(jnp.where(jnp.isnan(x), sign | 0x7F, _byte(converted)), dtype)


def _e8m0(x, dtype):
    """c10's fp8e8m0fnu_from_fp32_value: the biased exponent of |x|, plus one where the dropped
    mantissa is at least a half (ties round up: the implied bit is odd), except for a float32
    subnormal (implied bit 0: ties round down); NaN and inf give 255."""
    bits = _word(x)
    exponent = (bits >> 23) & 0xFF
    guard = (bits & 0x400000) != 0
    rest = (bits & 0x3FFFFF) != 0
    up = guard & (rest | (exponent > 0))
    biased = jnp.where(exponent == 0xFF, exponent, exponent + up.astype(jnp.uint32))
    return lax.bitcast_convert_type(biased.astype(jnp.uint8), dtype)


def _unsigned_zero(x, dtype):
    """float32 `x` in a fnuz format (no negative zero; byte 0x80 is its NaN): a negative value that
    rounds to zero is +0, where XLA's convert of a flushed subnormal can give 0x80."""
    byte = _byte(x.astype(dtype))
    return lax.bitcast_convert_type(jnp.where((byte == 0x80) & (jnp.abs(x) < 1), jnp.uint8(0), byte), dtype)


# float32 -> each float8 format, where XLA's convert differs from CPU's
_FROM_FLOAT32 = {
    np.dtype(jnp.float8_e4m3fn): functools.partial(_signed_nan, saturate=448.0),
    np.dtype(jnp.float8_e5m2): _signed_nan,
    np.dtype(jnp.float8_e4m3fnuz): _unsigned_zero,
    np.dtype(jnp.float8_e5m2fnuz): _unsigned_zero,
    np.dtype(jnp.float8_e8m0fnu): _e8m0,
}

# The float32 bits c10 gives each float8 NaN (byte b): e4m3fn sets every mantissa bit; e5m2 widens
# through float16, keeping the payload and setting the quiet bit; the formats with one NaN give
# a signalling NaN with payload 1.
_NAN_WORDS = {
    np.dtype(jnp.float8_e4m3fn): lambda b: ((b & 0x80) << 24) | 0x7FF00000,
    np.dtype(jnp.float8_e5m2): lambda b: ((b & 0x80) << 24) | 0x7FC00000 | ((b & 0x3) << 21),
    np.dtype(jnp.float8_e4m3fnuz): lambda b: jnp.uint32(0x7F800001),
    np.dtype(jnp.float8_e5m2fnuz): lambda b: jnp.uint32(0x7F800001),
    np.dtype(jnp.float8_e8m0fnu): lambda b: jnp.uint32(0x7F800001),
}


def _to_float32(x):
    """Array `x` as float32, as PyTorch's CPU kernels widen it (float8 NaNs with c10's payloads;
    a complex value's real part)."""
    src = np.dtype(x.dtype)
    if src.kind == "c":
        x, src = x.real, np.dtype(x.real.dtype)
    if src not in _FLOAT8:
        return x.astype(jnp.float32)
    wide = _word(x.astype(jnp.float32))
    nan = _NAN_WORDS[src](_byte(x).astype(jnp.uint32))
    return lax.bitcast_convert_type(jnp.where(jnp.isnan(x), nan, wide), jnp.float32)


def cast(x, dtype):
    """Array `x` in JAX dtype `dtype`, converted as PyTorch's CPU kernels convert (float8 through
    float32 with c10's rules); any other pair of dtypes is XLA's convert."""
    src, dst = np.dtype(x.dtype), np.dtype(dtype)
    if src == dst or (src not in _FLOAT8 and dst not in _FLOAT8):
        return x.astype(dst)
    wide = _to_float32(x)
    if dst == _F64 and src == _E8M0:
        # 2**(b - 127) from the bits: XLA:CPU flushes the float32 subnormal of byte 0 (2**-127)
        biased = _byte(x).astype(jnp.uint64)
        power = lax.bitcast_convert_type((biased + (1023 - 127)) << 52, jnp.float64)
        return jnp.where(biased == 0xFF, wide.astype(dst), power)
    if dst not in _FLOAT8:
        return wide if dst == _F32 else wide.astype(dst)
    return _FROM_FLOAT32[dst](wide, dst)


# ------------------------------------------------------------ scaled matmul
# CPU's _scaled_mm (Blas.cpp) accepts two scalings: tensorwise (one float32 scale per operand) and
# rowwise (float32 scale_a of (M, 1), scale_b of (1, N)). PyTorch's meta kernel judges a meta
# tensor as a CUDA one (row-major self, column-major mat2, sizes divisible by 16): neuron takes
# what CPU takes, so the meta function is CPU's checks.

def _tensorwise(t, scale) -> bool:
    return scale.dtype == torch.float32 and scale.numel() == 1


def _rowwise(t, scale) -> bool:
    return (scale.dtype == torch.float32 and scale.dim() == 2 and scale.shape[0] == t.shape[0]
            and scale.shape[1] == 1 and scale.is_contiguous())


_SCALINGS = (_tensorwise, _rowwise)


def _scaled_mm_meta(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                    use_fast_accum=False):
    if not any(self.dtype in FLOAT8 and mat2.dtype in FLOAT8 and accepts(self, scale_a)
               and accepts(mat2.t(), scale_b.t()) for accepts in _SCALINGS):
        raise ValueError(
            "Invalid scaling configuration.\n- For TensorWise scaling, a and b should be float8, scales should be "
            "float and singletons.\n- For RowWise scaling, a and b should be float8, scales should be float, "
            f"scale_a should be ({self.shape[0]}, 1) and scale_b should be (1, {mat2.shape[-1]}), and both should "
            f"be contiguous.\nGot a.dtype()={self.dtype}, scale_a.dtype()={scale_a.dtype}, scale_a.size()="
            f"{list(scale_a.shape)}, b.dtype()={mat2.dtype}, scale_b.dtype()={scale_b.dtype}, scale_b.size()="
            f"{list(scale_b.shape)}")
    for name, t in (("mat1", self), ("mat2", mat2)):
        if t.dim() != 2:
            raise RuntimeError(f"{name} must be a matrix")
    (m, k), (k2, n) = self.shape, mat2.shape
    if k != k2:
        raise RuntimeError(f"mat_a and mat_b shapes cannot be multiplied ({m}x{k} and {k2}x{n})")
    for name, scale in (("scale_a", scale_a), ("scale_b", scale_b)):
        if scale.numel() > 1 and scale.stride(1) != 1:
            raise ValueError(f"expected {name}.stride(1) to be 1, but got {scale.stride(1)}")
    if bias is not None and bias.numel() != n:
        raise RuntimeError(f"Bias must be size {n} but got {bias.numel()}")
    return self.new_empty((m, n), dtype=out_dtype or self.dtype)


@lowers(aten._scaled_mm.default, meta=_scaled_mm_meta)
def scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
    """A float8 dot accumulated in float32 (an FP8 accelerator's native matmul), then scaled by
    the outer product of the scales; CPU scales the operands in float32 before its float32 matmul,
    which differs by float32 rounding of the scaling (none for power-of-two scales). bias adds in
    float32; a float8 result is divided by scale_result, as CPU. use_fast_accum is a CUDA
    accumulation choice that XLA makes for itself here."""
    out = lax.dot_general(self, mat2, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    out = out * _as_scale(scale_a) * _as_scale(scale_b)
    if bias is not None:
        out = out + _to_float32(bias)
    dtype = np.dtype(self.dtype) if out_dtype is None else np.dtype(to_jax(out_dtype))
    if scale_result is not None and dtype in _SCALED_RESULTS:
        out = out * (jnp.float32(1) / scale_result.reshape(()).astype(jnp.float32))
    return cast(out, dtype)


# the float8 results CPU divides by scale_result
_SCALED_RESULTS = frozenset((np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2)))


def _as_scale(scale):
    """A tensorwise scale as a scalar; a rowwise one keeps its (M, 1) or (1, N) shape."""
    return scale.reshape(()) if scale.size == 1 else scale


@lowers(aten._int_mm.default)
def int_mm(self, mat2):
    """int8 (or uint8) x int8 accumulated exactly in int32: an integer accelerator's native dot
    (torchao's int8 dynamic quantization). XLA takes no mixed-signedness dot: uint8 widens first."""
    lhs = self.astype(jnp.int16) if self.dtype != mat2.dtype else self
    return lax.dot_general(lhs, mat2, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
