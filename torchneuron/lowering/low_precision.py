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
tests/test_low_precision.py compares every float8 byte and a sweep of float32 bit patterns.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..runtime.dtypes import FLOAT8, to_jax

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
