"""Lowerings: elementwise arithmetic, comparison, logic, math functions and copies.

Conventions: with `promote=` the driver has already cast the promoted tensors and every traced
Scalar to PyTorch's computation dtype (float32 for half types), so these functions compute in
that dtype; the driver casts the result to the op's result dtype. Formulas follow PyTorch's CPU
kernels where the choice of formula changes values (division, rounding, NaN handling).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..runtime.dtypes import CPU_ACC_TYPE, scalar_type_name, to_jax
from . import DEFAULT, INT_TO_FLOAT, NO_OPMATH, aten, functional_of, lowers, overrides_meta, refuses
from .low_precision import cast
from .padding import Padding, all_axes, pads, position_wise

SELF = ("self",)


def _is_exact(x) -> bool:
    """Integer or bool: rounding functions are the identity on these."""
    return jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_


def _is_complex(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.complexfloating)


def _const(value, like):
    return jnp.asarray(value, dtype=like.dtype)


# ------------------------------------------------------------------ arithmetic
@lowers(aten.add.Tensor, aten.add.Scalar, promote=DEFAULT)
def add(self, other, alpha=1):
    return self + other * alpha


@lowers(aten.sub.Tensor, aten.sub.Scalar, promote=DEFAULT)
def sub(self, other, alpha=1):
    return self - other * alpha


@lowers(aten.rsub.Tensor, aten.rsub.Scalar, promote=DEFAULT)
def rsub(self, other, alpha=1):
    return other - self * alpha


@lowers(aten.mul.Tensor, aten.mul.Scalar, promote=DEFAULT)
def mul(self, other):
    return self * other


# true_divide is div's composite alias, which eager dispatch expands; it reaches graphs that divide
# by a Python float Dynamo passes as a tensor (dynamic=True: GPT-2's GELU)
@lowers(aten.true_divide.Tensor, promote=INT_TO_FLOAT, graph_only=True)
@lowers(aten.div.Tensor, aten.div.Scalar, promote=INT_TO_FLOAT)
def div(self, other):
    return _true_divide(self, other)


def _true_divide(a, b):
    """a / b rounded once, as CPU divides. XLA rewrites a division by a broadcast divisor (a scalar,
    a per-row scale) into a multiplication by its rounded reciprocal, one ulp off in most elements
    (torchao's `amax / 127.5` scales then quantize weights a step apart from CPU's); a full-shape
    divisor behind an optimization barrier keeps the division."""
    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
    if jnp.shape(b) != shape and jnp.issubdtype(jnp.result_type(a, b), jnp.floating):
        b = lax.optimization_barrier(jnp.broadcast_to(b, shape))
    return a / b


def _floor_divide_float(a, b):
    # PyTorch's div_floor_floating: floor((a - fmod(a, b)) / b), corrected so the quotient is
    # the exact floor even where a / b rounds up to an integer.
    mod = jnp.fmod(a, b)
    quotient = (a - mod) / b
    quotient = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), quotient - 1, quotient)
    floored = jnp.floor(quotient)
    floored = jnp.where(quotient - floored > 0.5, floored + 1, floored)
    floored = jnp.where(quotient == 0, jnp.copysign(jnp.zeros_like(a), a / b), floored)
    return jnp.where(b == 0, a / b, floored)


def _divide(a, b, rounding_mode):
    # (a graph may pass two Python numbers: `torch.div(8, 4, rounding_mode="trunc")` traced live)
    a, b = (x if hasattr(x, "dtype") else jnp.asarray(x) for x in (a, b))
    if rounding_mode is None:
        if _is_exact(a):  # true division of integers computes in the default float dtype
            dtype = to_jax(torch.get_default_dtype())
            return _true_divide(a.astype(dtype), b.astype(dtype))
        return _true_divide(a, b)
    if rounding_mode == "trunc":
        return lax.div(a, b) if _is_exact(a) else jnp.trunc(_true_divide(a, b))
    if _is_exact(a):
        return jnp.floor_divide(a, b)
    return _floor_divide_float(a, b)


@lowers(aten.div.Tensor_mode, aten.div.Scalar_mode, promote=DEFAULT)
def div_mode(self, other, *, rounding_mode=None):
    return _divide(self, other, rounding_mode)


@lowers(aten.floor_divide.default, aten.floor_divide.Scalar, promote=DEFAULT)
def floor_divide(self, other):
    return _divide(self, other, "floor")


@lowers(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor, promote=DEFAULT)
def remainder(self, other):
    # jnp.remainder is fmod shifted by the divisor when the signs differ: PyTorch's rule
    return jnp.remainder(self, other)


@lowers(aten.fmod.Tensor, aten.fmod.Scalar, promote=DEFAULT)
def fmod(self, other):
    return jnp.fmod(self, other)


@lowers(aten.pow.Tensor_Tensor, aten.pow.Scalar, promote=DEFAULT, promote_args=("self", "exponent"))
def power(self, exponent):
    if not _is_exact(self) or self.dtype == jnp.bool_:
        return jnp.power(self, exponent)
    # integer powers: a negative exponent gives 0 except for bases 1 and -1
    positive = jnp.power(self, jnp.maximum(exponent, 0))
    one = jnp.ones_like(positive)
    negative = jnp.where(self == 1, one, jnp.where(self == -1, jnp.where(exponent % 2 == 0, one, -one), 0 * one))
    return jnp.where(exponent < 0, negative, positive)


@lowers(aten.pow.Tensor_Scalar, promote=DEFAULT, promote_args=("self", "exponent"))
def power_scalar(self, exponent):
    if not jnp.issubdtype(self.dtype, jnp.floating):
        return power(self, exponent)
    # PyTorch's CPU kernel turns these exponents into sqrt, rsqrt and products, which differ from
    # pow at -0 and -inf (pow(-inf, 0.5) is inf, sqrt(-inf) is NaN) and in rounding
    special = ((0.5, jnp.sqrt(self)), (-0.5, lax.rsqrt(self)), (2, self * self), (3, self * self * self),
               (-1, 1 / self), (-2, 1 / (self * self)))
    result = jnp.power(self, exponent)
    for value, replacement in special:
        result = jnp.where(exponent == value, replacement, result)
    return result


@lowers(aten.neg.default)
def neg(self):
    return -self


@lowers(aten.abs.default)
def absolute(self):
    return self if self.dtype == jnp.bool_ else jnp.abs(self)


@overrides_meta(aten.abs.out)
def _abs_out_meta(self, *, out):
    """CPU's abs_out (PyTorch's meta kernel wants out in the result's dtype): a complex input's
    magnitudes go to a complex out, or to a real out its real dtype casts to; any other input's
    out has the input's dtype."""
    from torch._prims_common.wrappers import _maybe_resize_out, _safe_copy_out
    value = aten.abs.default(self)
    if self.dtype.is_complex and not out.dtype.is_complex:
        if not torch.can_cast(value.dtype, out.dtype):
            raise RuntimeError(f"result type {scalar_type_name(value.dtype)} can't be cast to the desired output type "
                               f"{scalar_type_name(out.dtype)}")
    elif out.dtype != self.dtype:
        raise RuntimeError(f"Found dtype {scalar_type_name(out.dtype)} but expected {scalar_type_name(self.dtype)}")
    _maybe_resize_out(out, value.shape)
    _safe_copy_out(copy_from=value, copy_to=out, exact_dtype=False)
    return out


@lowers(aten.sign.default)
def sign(self):
    if self.dtype == jnp.bool_:
        return self
    # (x > 0) - (x < 0): NaN has sign 0 in PyTorch
    return (self > 0).astype(self.dtype) - (self < 0).astype(self.dtype)


@lowers(aten.sgn.default)
def sgn(self):
    if not _is_complex(self):
        return sign(self)
    magnitude = jnp.abs(self)
    return jnp.where(magnitude == 0, jnp.zeros_like(self), self / magnitude)


@lowers(aten.reciprocal.default, promote=INT_TO_FLOAT, promote_args=SELF)
def reciprocal(self):
    return 1 / self


@lowers(aten.rsqrt.default, promote=INT_TO_FLOAT, promote_args=SELF)
def rsqrt(self):
    return 1 / jnp.sqrt(self) if _is_complex(self) else lax.rsqrt(self)


@lowers(aten.addcmul.default, promote=DEFAULT, promote_args=("self", "tensor1", "tensor2"))
def addcmul(self, tensor1, tensor2, *, value=1):
    return self + value * tensor1 * tensor2


@lowers(aten.addcdiv.default, promote=DEFAULT, promote_args=("self", "tensor1", "tensor2"))
def addcdiv(self, tensor1, tensor2, *, value=1):
    return self + value * (tensor1 / tensor2)


@lowers(aten.lerp.Scalar, aten.lerp.Tensor, promote=DEFAULT, promote_args=("self", "end", "weight"))
def lerp(self, end, weight):
    # PyTorch interpolates from whichever end is nearer, so lerp(a, b, 1) is exactly b
    diff = end - self
    return jnp.where(jnp.abs(weight) < 0.5, self + weight * diff, end - diff * (1 - weight))


# ------------------------------------------------------------ unary math (int -> float)
def _complex_exp(z):
    """exp of complex z with C99's (glibc's cexp, CPU's std::exp) values where XLA's differ: a real
    part of +inf with an imaginary part inf or NaN gives (inf, NaN), -inf gives (0, +-0) (XLA: NaN
    for both); a zero imaginary part stays, with its sign (XLA: +0)."""
    re, im = jnp.real(z), jnp.imag(z)
    out = jnp.exp(z)
    out = jnp.where(im == 0, lax.complex(jnp.real(out), im), out)
    positive = re > 0
    fixed = lax.complex(jnp.where(positive, jnp.inf, 0).astype(re.dtype),
                        jnp.where(positive, jnp.nan, jnp.copysign(jnp.zeros_like(im), im)))
    return jnp.where(jnp.isinf(re) & ~jnp.isfinite(im), fixed, out)


def _spherical_bessel_j0(x):
    """CPU's spherical_bessel_j0_forward: 0 at +-inf, a Taylor polynomial below 0.5, else sin(x)/x."""
    x2 = x * x
    poly = jnp.zeros_like(x)
    for c in (1 / 6227020800.0, -1 / 39916800.0, 1 / 362880.0, -1 / 5040.0, 1 / 120.0, -1 / 6.0):
        poly = x2 * (_const(c, x) + poly)
    small = 1 + poly
    far = jnp.sin(x) / jnp.where(jnp.abs(x) < 0.5, jnp.ones_like(x), x)
    return jnp.where(jnp.isinf(x), jnp.zeros_like(x), jnp.where(jnp.abs(x) < 0.5, small, far))


_FLOAT_UNARY = {
    aten.sqrt.default: jnp.sqrt,
    aten.exp.default: lambda x: _complex_exp(x) if _is_complex(x) else jnp.exp(x),
    aten.exp2.default: jnp.exp2,
    aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log,
    aten.log2.default: jnp.log2,
    aten.log10.default: jnp.log10,
    aten.log1p.default: jnp.log1p,
    aten.sin.default: jnp.sin,
    aten.cos.default: jnp.cos,
    aten.tan.default: jnp.tan,
    aten.asin.default: jnp.arcsin,
    aten.acos.default: jnp.arccos,
    aten.atan.default: jnp.arctan,
    aten.sinh.default: jnp.sinh,
    aten.cosh.default: jnp.cosh,
    aten.tanh.default: jnp.tanh,
    aten.asinh.default: jnp.arcsinh,
    aten.acosh.default: jnp.arccosh,
    aten.atanh.default: jnp.arctanh,
    aten.erf.default: lax.erf,
    aten.erfc.default: lax.erfc,
    aten.erfinv.default: lax.erf_inv,
    aten.sigmoid.default: lax.logistic,
    aten.lgamma.default: lax.lgamma,
    aten.i0.default: jax.scipy.special.i0,
    aten.sinc.default: jnp.sinc,
    aten.special_erfcx.default: jax.scipy.special.erfcx,
    aten.special_i0e.default: jax.scipy.special.i0e,
    aten.special_entr.default: jax.scipy.special.entr,
    aten.special_i1.default: jax.scipy.special.i1,
    aten.special_i1e.default: jax.scipy.special.i1e,
    aten.special_ndtri.default: jax.scipy.special.ndtri,
    aten.special_log_ndtr.default: jax.scipy.special.log_ndtr,
    aten.special_modified_bessel_i0.default: jax.scipy.special.i0,
    aten.special_modified_bessel_i1.default: jax.scipy.special.i1,
    aten.special_spherical_bessel_j0.default: lambda x: _spherical_bessel_j0(x),
}
for _op, _fn in _FLOAT_UNARY.items():
    lowers(_op, promote=INT_TO_FLOAT, promote_args=SELF)(lambda self, _fn=_fn: _fn(self))


# digamma and trigamma follow CPU's scalar kernels (calc_digamma, calc_trigamma) step by step, in
# float32 for float32 and half inputs: near the poles their values are differences of large terms,
# and another series (XLA's) lands ~2e-5 away in float32.
_DIGAMMA_ASYMPTOTIC = (8.33333333333333333333E-2, -2.10927960927960927961E-2, 7.57575757575757575758E-3,
                       -4.16666666666666666667E-3, 3.96825396825396825397E-3, -8.33333333333333333333E-3,
                       8.33333333333333333333E-2)
_DIGAMMA_10 = 2.25175258906672110764


def _digamma_positive(x):
    """digamma for x > 0 (and NaN/inf): x raised past 10 by the recurrence, then the asymptotic
    series, as CPU's calc_digamma."""
    result = jnp.zeros_like(x)
    for _ in range(10):  # 0 < x < 10 needs at most 10 steps
        below = x < 10
        result = jnp.where(below, result - 1 / x, result)
        x = jnp.where(below, x + 1, x)
    z = 1 / (x * x)
    poly = jnp.zeros_like(x)
    for a in _DIGAMMA_ASYMPTOTIC:
        poly = poly * z + _const(a, x)
    tail = jnp.where(x < 1e17, z * poly, 0)
    value = result + jnp.log(x) - _const(0.5, x) / x - tail
    return jnp.where(x == 10, result + _const(_DIGAMMA_10, x), value)


@lowers(aten.digamma.default, promote=INT_TO_FLOAT, promote_args=SELF)
def digamma(self):
    x = self
    negative = x < 0
    # Reflection for x < 0 through the fractional part r (tan(pi r) is exact where tan(pi x) is
    # not), the pi / tan term in double as on CPU.
    r = (x - jnp.trunc(x)).astype(jnp.float64)
    reflection = (jnp.pi / jnp.tan(jnp.pi * r)).astype(x.dtype)
    value = _digamma_positive(jnp.where(negative, 1 - x, x))
    value = jnp.where(negative, value - reflection, value)
    value = jnp.where(negative & (x == jnp.trunc(x)), _const(jnp.nan, x), value)
    value = jnp.where(x == 0, jnp.copysign(_const(jnp.inf, x), -x), value)  # digamma(±0) = ∓inf
    return value.astype(self.dtype)


def _trigamma(self):
    """CPU's calc_trigamma: reflection below 1/2, six recurrence steps, then the asymptotic series."""
    x = self
    pi = _const(math.pi, x)
    reflect = x < 0.5
    sin_pi_x = jnp.sin(pi * x)
    result = jnp.where(reflect, -(pi * pi) / (sin_pi_x * sin_pi_x), jnp.zeros_like(x))
    x = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    one = _const(1, x)
    series = (one + one / (2 * x) + ixx * (_const(1 / 6, x) - ixx * (_const(1 / 30, x) - ixx * _const(1 / 42, x))))
    result = result + series / x
    return jnp.where(reflect, -result, result).astype(self.dtype)


@lowers(aten.polygamma.default, promote=INT_TO_FLOAT, promote_args=SELF)
def polygamma(n, self):
    if n == 0:
        return digamma(self)
    if n == 1:
        return _trigamma(self)
    # CPU sums the zeta series in its acc_type, double for float32: near the roots on the negative
    # axis the result is what is left after terms of opposite sign cancel, and float32 sums keep
    # none of it (0.2-30x relative errors at -9.5..-1.5 for n = 4, 6). Half inputs arrive in float32.
    value = _polygamma_positive(n, self.astype(CPU_ACC_TYPE.get(self.dtype, self.dtype))).astype(self.dtype)
    # poles at 0, -1, -2...: (-1)^(n+1) n! zeta(n+1, x) with zeta infinite there, as on CPU
    pole = (self <= 0) & (self == jnp.floor(self))
    return jnp.where(pole, _const(jnp.inf if n % 2 else -jnp.inf, value), value)


_SHIFT_LIMIT = 64
# JAX's series is accurate only well away from 0: its float32 value at x + k in (0, 1] carries an
# absolute error that, near the roots on the negative axis, exceeds the result. CPU (Cephes) sums
# the first nine terms directly and starts its series at 9 or more; so do we.
_DIRECT_TERMS = 9


def _polygamma_positive(n, x):
    """JAX's polygamma (a Hurwitz zeta series) is wrong for negative x and inaccurate just above 0.
    Shift x up by k = ceil(-x) + 9 with
    psi_n(x) = psi_n(x + k) - (-1)^n n! sum_{j<k} 1 / (x + j)^(n + 1);
    arguments below -_SHIFT_LIMIT shift by the limit only."""
    k = jnp.clip(jnp.ceil(-x), 0, _SHIFT_LIMIT) + _DIRECT_TERMS

    def add_term(j, acc):
        return acc + jnp.where(j < k, 1 / (x + j) ** (n + 1), 0)

    terms = lax.fori_loop(0, _SHIFT_LIMIT + _DIRECT_TERMS, add_term, jnp.zeros_like(x))
    sign = -1.0 if n % 2 else 1.0
    return jax.scipy.special.polygamma(n, x + k) - sign * math.factorial(n) * terms


@lowers(aten.mvlgamma.default, promote=INT_TO_FLOAT, promote_args=SELF)
def mvlgamma(self, p):
    offsets = jnp.arange(p, dtype=self.dtype) * -0.5
    terms = lax.lgamma(self[..., None] + offsets).sum(-1)
    return terms + _const(p * (p - 1) / 4 * math.log(math.pi), self)


def _incomplete_gamma(a, x, fn, at_zero_x):
    """PyTorch's edge cases around the regularized incomplete gamma function `fn`
    (at_zero_x: its value at x == 0, where `1 - at_zero_x` is the value as x or 1/a grows)."""
    nan, low, high = _const(jnp.nan, a), _const(at_zero_x, a), _const(1 - at_zero_x, a)
    value = jnp.where(jnp.isinf(x), high, fn(a, x))
    value = jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), nan, low), value)
    value = jnp.where(x == 0, low, value)
    value = jnp.where(a == 0, jnp.where(x > 0, high, nan), value)
    return jnp.where((x < 0) | (a < 0), nan, value)


@lowers(aten.igamma.default, promote=DEFAULT)
def igamma(self, other):
    return _incomplete_gamma(self, other, jax.scipy.special.gammainc, 0)


@lowers(aten.igammac.default, promote=DEFAULT)
def igammac(self, other):
    return _incomplete_gamma(self, other, jax.scipy.special.gammaincc, 1)


@lowers(aten.logit.default, promote=INT_TO_FLOAT, promote_args=SELF)
def logit(self, eps=None):
    x = self if eps is None else jnp.clip(self, eps, 1 - eps)
    return jnp.log(x / (1 - x))


@lowers(aten.deg2rad.default, promote=INT_TO_FLOAT, promote_args=SELF)
def deg2rad(self):
    return self * _const(math.pi / 180, self)


@lowers(aten.rad2deg.default, promote=INT_TO_FLOAT, promote_args=SELF)
def rad2deg(self):
    return self * _const(180 / math.pi, self)


@lowers(aten.angle.default, promote=INT_TO_FLOAT, promote_args=SELF)
def angle(self):
    if _is_complex(self):
        return jnp.angle(self)
    return jnp.where(jnp.isnan(self), self, jnp.where(self < 0, _const(math.pi, self), jnp.zeros_like(self)))


@lowers(aten._conj_physical.default, aten.conj_physical.default)  # the latter for conj_physical_ and .out
def conj_physical(self):
    return jnp.conj(self) if _is_complex(self) else self


@lowers(aten.complex.default)
def complex_(real, imag):
    real, imag = jnp.broadcast_arrays(real, imag)
    return lax.complex(real, imag)


@lowers(aten.polar.default)
def polar(abs, angle):
    return lax.complex(abs * jnp.cos(angle), abs * jnp.sin(angle))


@lowers(aten.ldexp.Tensor, promote=INT_TO_FLOAT)
def ldexp(self, other):
    return self * jnp.exp2(other)


_BITS = {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


@lowers(aten.frexp.Tensor)
def frexp(self):
    """From the bits: XLA:CPU treats subnormal inputs as zero in arithmetic (jnp.frexp gave them
    back with exponent 0), and CPU's std::frexp normalises them. Zero, inf and NaN keep themselves
    with exponent 0."""
    info = jnp.finfo(self.dtype)
    bits = _BITS[self.dtype.itemsize]
    nmant, bias = info.nmant, info.maxexp - 1
    u = lax.bitcast_convert_type(self, bits)
    one = jnp.array(1, bits)
    fraction_mask = (one << nmant) - one
    field = ((u >> nmant) & ((one << (info.nexp)) - one)).astype(jnp.int32)
    fraction = u & fraction_mask
    # a subnormal's fraction shifted until its leading one is the implicit bit
    width = 8 * self.dtype.itemsize
    lead = (width - 1) - lax.clz(jnp.where(fraction == 0, one, fraction)).astype(jnp.int32)  # its top bit
    subnormal = (field == 0) & (fraction != 0)
    shift = jnp.where(subnormal, nmant - lead, 0).astype(bits)
    fraction = (fraction << shift) & fraction_mask
    exponent = jnp.where(subnormal, lead - nmant - bias + 2, field - bias + 1)
    sign = u & (one << (width - 1))
    mantissa = lax.bitcast_convert_type(sign | (jnp.array(bias - 1, bits) << nmant) | fraction, self.dtype)
    special = (self == 0) & ~subnormal | ~jnp.isfinite(self)
    return jnp.where(special, self, mantissa), jnp.where(special, 0, exponent).astype(jnp.int32)


# ------------------------------------------------------------ binary math
@lowers(aten.atan2.default, promote=INT_TO_FLOAT)
def atan2(self, other):
    return jnp.arctan2(self, other)


@lowers(aten.hypot.default, promote=DEFAULT)
def hypot(self, other):
    return jnp.hypot(self, other)


@lowers(aten.copysign.Tensor, aten.copysign.Scalar, promote=INT_TO_FLOAT)
def copysign(self, other):
    return jnp.copysign(self, other)


@lowers(aten.nextafter.default, promote=NO_OPMATH)  # the neighbour in the tensor's own dtype
def nextafter(self, other):
    return jnp.nextafter(self, other)


def _heaviside_dtypes(self, values, *, out=None):
    if self.is_complex() or values.is_complex() or (out is not None and out.is_complex()):
        raise RuntimeError("heaviside is not yet implemented for complex tensors.")
    if self.dtype != values.dtype or (out is not None and out.dtype != self.dtype):
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")


refuses(_heaviside_dtypes, aten.heaviside.default, aten.heaviside_.default, aten.heaviside.out)


@lowers(aten.heaviside.default, promote=DEFAULT, promote_args=("self", "values"))
def heaviside(self, values):
    return jnp.where(self == 0, values, (self > 0).astype(values.dtype))


@lowers(aten.logaddexp.default, promote=DEFAULT)
def logaddexp(self, other):
    return jnp.logaddexp(self, other)


@lowers(aten.logaddexp2.default, promote=DEFAULT)
def logaddexp2(self, other):
    return jnp.logaddexp2(self, other)


def _xlog(x, y, log):
    # 0 * log(0) is 0, but NaN in y still propagates
    return jnp.where(jnp.isnan(y), y, jnp.where(x == 0, jnp.zeros_like(x), x * log(y)))


@lowers(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other, promote=INT_TO_FLOAT)
def xlogy(self, other):
    return _xlog(self, other, jnp.log)


@lowers(aten.special_xlog1py.default, aten.special_xlog1py.self_scalar, aten.special_xlog1py.other_scalar,
        promote=INT_TO_FLOAT)
def xlog1py(self, other):
    return _xlog(self, other, jnp.log1p)


@lowers(aten.gcd.default, promote=DEFAULT)
def gcd(self, other):
    return jnp.gcd(self, other)


@lowers(aten.lcm.default, promote=DEFAULT)
def lcm(self, other):
    return jnp.lcm(self, other)


# ------------------------------------------------------------ rounding
def _rounding(fn):
    return lambda self: self if _is_exact(self) else fn(self)


lowers(aten.floor.default)(_rounding(jnp.floor))
lowers(aten.ceil.default)(_rounding(jnp.ceil))
lowers(aten.trunc.default)(_rounding(jnp.trunc))
lowers(aten.round.default)(_rounding(jnp.round))  # half to even, as nearbyint


@lowers(aten.round.decimals, promote=DEFAULT, promote_args=SELF)
def round_decimals(self, *, decimals):
    if _is_exact(self):
        return self
    scale = _const(10.0 ** abs(decimals), self)
    if decimals < 0:
        return jnp.round(self / scale) * scale
    return jnp.round(self * scale) / scale


@lowers(aten.frac.default)
def frac(self):
    return self - jnp.trunc(self)


# ------------------------------------------------------------ comparison and logic
def _binary(fn):
    """A two-argument jnp function as a lowering: the dispatcher passes `other` by name."""
    return lambda self, other: fn(self, other)


lowers(aten.eq.Tensor, aten.eq.Scalar, promote=DEFAULT)(_binary(jnp.equal))
lowers(aten.ne.Tensor, aten.ne.Scalar, promote=DEFAULT)(_binary(jnp.not_equal))
lowers(aten.lt.Tensor, aten.lt.Scalar, promote=DEFAULT)(_binary(jnp.less))
lowers(aten.le.Tensor, aten.le.Scalar, promote=DEFAULT)(_binary(jnp.less_equal))
lowers(aten.gt.Tensor, aten.gt.Scalar, promote=DEFAULT)(_binary(jnp.greater))
lowers(aten.ge.Tensor, aten.ge.Scalar, promote=DEFAULT)(_binary(jnp.greater_equal))


def _truth(x):
    return x if x.dtype == jnp.bool_ else x != 0


@lowers(aten.logical_and.default)
def logical_and(self, other):
    return _truth(self) & _truth(other)


@lowers(aten.logical_or.default)
def logical_or(self, other):
    return _truth(self) | _truth(other)


@lowers(aten.logical_xor.default)
def logical_xor(self, other):
    return _truth(self) ^ _truth(other)


@lowers(aten.logical_not.default)
def logical_not(self):
    return ~_truth(self)


lowers(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_and.Scalar_Tensor,
       promote=DEFAULT)(_binary(jnp.bitwise_and))
lowers(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.bitwise_or.Scalar_Tensor,
       promote=DEFAULT)(_binary(jnp.bitwise_or))
lowers(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.bitwise_xor.Scalar_Tensor,
       promote=DEFAULT)(_binary(jnp.bitwise_xor))
lowers(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
       aten.bitwise_left_shift.Scalar_Tensor, promote=DEFAULT)(_binary(jnp.left_shift))
lowers(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
       aten.bitwise_right_shift.Scalar_Tensor, promote=DEFAULT)(_binary(jnp.right_shift))
lowers(aten.__lshift__.Tensor, aten.__lshift__.Scalar, promote=DEFAULT)(_binary(jnp.left_shift))
lowers(aten.__rshift__.Tensor, aten.__rshift__.Scalar, promote=DEFAULT)(_binary(jnp.right_shift))
for _overload in ("Tensor", "Scalar"):  # (`x <<= y` is __ilshift__: no trailing underscore to drop)
    functional_of(getattr(aten.__ilshift__, _overload), getattr(aten.__lshift__, _overload))
    functional_of(getattr(aten.__irshift__, _overload), getattr(aten.__rshift__, _overload))


@lowers(aten.bitwise_not.default)
def bitwise_not(self):
    return jnp.invert(self)


@lowers(aten.isnan.default)
def isnan(self):
    return jnp.isnan(self)


@lowers(aten.isinf.default)
def isinf(self):
    return jnp.isinf(self)


@lowers(aten.isposinf.default)
def isposinf(self):
    return jnp.isposinf(self) if not _is_exact(self) else jnp.zeros(self.shape, bool)


@lowers(aten.isneginf.default)
def isneginf(self):
    return jnp.isneginf(self) if not _is_exact(self) else jnp.zeros(self.shape, bool)


@lowers(aten.signbit.default)
def signbit(self):
    return self < 0 if _is_exact(self) else jnp.signbit(self)


# ------------------------------------------------------------ selection and clamping
@lowers(aten.maximum.default, promote=DEFAULT)
def maximum(self, other):
    return jnp.maximum(self, other)  # NaN propagates


@lowers(aten.minimum.default, promote=DEFAULT)
def minimum(self, other):
    return jnp.minimum(self, other)


@lowers(aten.fmax.default, promote=DEFAULT)
def fmax(self, other):
    return jnp.fmax(self, other)  # NaN loses to a number


@lowers(aten.fmin.default, promote=DEFAULT)
def fmin(self, other):
    return jnp.fmin(self, other)


def _clamp_min(x, low):
    # a NaN input stays NaN; a NaN bound makes the result NaN (torch._refs.clamp)
    return jnp.where((x >= low) | jnp.isnan(x), x, low)


def _clamp_max(x, high):
    return jnp.where((x <= high) | jnp.isnan(x), x, high)


def _meta(t):
    """A meta tensor like `t` (or `t` itself, a number): rules run on the call's own tensors and
    must not compute on them."""
    return torch.empty_like(t, device="meta") if isinstance(t, torch.Tensor) else t


def _clamp_bounds(self, min=None, max=None, *, out=None):
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    if out is not None and not isinstance(min, torch.Tensor) and not isinstance(max, torch.Tensor):
        # with Scalar bounds CPU's kernel is a unary op: the out's dtype must be the result's
        result = aten.clamp.default(_meta(self), min, max).dtype
        if out.dtype != result:
            raise RuntimeError(f"Found dtype {scalar_type_name(out.dtype)} but expected {scalar_type_name(result)}")


refuses(_clamp_bounds, aten.clamp.default, aten.clamp_.default, aten.clamp.out, aten.clamp.Tensor,
        aten.clamp_.Tensor, aten.clamp.Tensor_out)


@lowers(aten.clamp.default, aten.clamp.Tensor, promote=DEFAULT, promote_args=("self", "min", "max"))
def clamp(self, min=None, max=None):
    x = self if min is None else _clamp_min(self, min)
    return x if max is None else _clamp_max(x, max)


@lowers(aten.clamp_min.default, aten.clamp_min.Tensor, promote=DEFAULT, promote_args=("self", "min"))
def clamp_min(self, min):
    return _clamp_min(self, min)


@lowers(aten.clamp_max.default, aten.clamp_max.Tensor, promote=DEFAULT, promote_args=("self", "max"))
def clamp_max(self, max):
    return _clamp_max(self, max)


def _where_out_dtype(condition, self, other, *, out):
    result = aten.where.self(_meta(condition), _meta(self), _meta(other)).dtype
    if out.dtype != result:
        raise RuntimeError(f"Expected out type to be {scalar_type_name(result)} but got {scalar_type_name(out.dtype)}")


refuses(_where_out_dtype, aten.where.self_out)


@lowers(aten.where.self, promote=DEFAULT)
def where(condition, self, other):
    return jnp.where(_truth(condition), self, other)


@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(self, mask, value):
    return jnp.where(mask, jnp.asarray(value).astype(self.dtype), self)


@lowers(aten.nan_to_num.default)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    if _is_exact(self):
        return self
    return jnp.nan_to_num(self, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


# ------------------------------------------------------------ copy
# copy_ reaches the table only in graphs, into an intermediate; a copy_ into a graph input is a
# mutation, which the compile driver writes back. In eager mode copies are transfers.
@lowers(aten.copy_.default, graph_only=True)
@lowers(aten.copy.default)
def copy(self, src, non_blocking=False):
    return cast(jnp.broadcast_to(src, self.shape), self.dtype)


@lowers(aten._to_copy.default, graph_only=True)
def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    # x.to(dtype / device / memory format) in a graph: only the dtype changes a value; the device
    # of a graph output is restored from its meta value when the executable returns.
    return self if dtype is None else cast(self, to_jax(dtype))


# Dynamo passes a Python float it does not specialize (dynamic=True: RMSNorm's eps) as a float64
# scalar tensor, and the graph casts it with this prim.
@lowers(torch.ops.prims.convert_element_type.default, graph_only=True)
def convert_element_type(a, dtype):
    return cast(a, to_jax(dtype))


@lowers(aten.lift_fresh_copy.default, graph_only=True)
def lift_fresh_copy(self):
    return self



@lowers(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    elements, test = jnp.asarray(elements), jnp.asarray(test_elements).reshape(-1)
    common = jnp.promote_types(elements.dtype, test.dtype)
    found = (elements.astype(common)[..., None] == test.astype(common)).any(-1) if test.size else \
        jnp.zeros(elements.shape, bool)
    return ~found if invert else found


@lowers(aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar,
        promote=INT_TO_FLOAT)
def special_zeta(self, other):
    """Hurwitz zeta(x, q); NaN where x < 1 as on CPU (JAX's series does not say so itself)."""
    value = jax.scipy.special.zeta(self, other)
    return jnp.where(self < 1, jnp.nan, value)


# ------------------------------------------------------------------ padding rules
# How each op stays exact on operands padded along a growing axis (padding.py).
pads(aten._to_copy.default, torch.ops.prims.convert_element_type.default)(position_wise)


@pads(aten.isin.Tensor_Tensor)
def _isin_padding(call):
    # position-wise in the elements; a padded test element could match one of them
    return Padding(exact=(("test_elements", all_axes(call["test_elements"])),))
