import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from tests.reference import check

NAN, INF = math.nan, math.inf


pytestmark = pytest.mark.usefixtures("lowered_only")


def floats(dtype=torch.float32, shape=(3, 5), special=True):
    x = torch.randn(shape, dtype=torch.float64) * 2
    if special:
        x.view(-1)[:5] = torch.tensor([0.0, -0.0, NAN, INF, -INF])[: x.numel()]
    return x.to(dtype)


def ints(dtype=torch.int64, shape=(3, 5), low=-9, high=10):
    return torch.randint(low, high, shape).to(dtype)


def tolerance(dtype):
    if dtype in (torch.bfloat16, torch.float16):
        return {"rtol": 2e-2, "atol": 2e-2}
    if dtype == torch.float32:
        return {"rtol": 2e-5, "atol": 1e-5}
    return {}


UNARY = [torch.sqrt, torch.rsqrt, torch.reciprocal, torch.exp, torch.exp2, torch.expm1, torch.log, torch.log2,
         torch.log10, torch.log1p, torch.sin, torch.cos, torch.tan, torch.asin, torch.acos, torch.atan, torch.sinh,
         torch.cosh, torch.tanh, torch.asinh, torch.acosh, torch.atanh, torch.erf, torch.erfc, torch.erfinv,
         torch.sigmoid, torch.logit, torch.lgamma, torch.digamma, torch.i0, torch.sinc, torch.special.erfcx,
         torch.deg2rad, torch.rad2deg, torch.angle, torch.abs, torch.neg, torch.sign, torch.sgn, torch.floor,
         torch.ceil, torch.trunc, torch.round, torch.frac, torch.isnan, torch.isinf, torch.isposinf, torch.isneginf,
         torch.isfinite, torch.signbit, torch.nan_to_num, torch.relu, torch.square, torch.positive]
EXACT_FOR_INTS = {torch.frac, torch.logit}  # float-only in PyTorch


@pytest.mark.parametrize("fn", UNARY, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
def test_unary(fn, dtype):
    if dtype == torch.int64 and fn in EXACT_FOR_INTS:
        pytest.skip("float-only op")
    x = ints(dtype) if dtype == torch.int64 else floats(dtype)
    if fn in (torch.lgamma, torch.digamma) and dtype != torch.int64:
        x = x.abs() + 0.1  # poles: both sides are right, but differ in rounding near them
    try:
        fn(x)
    except (NotImplementedError, RuntimeError):
        pytest.skip("PyTorch's CPU kernel lacks this dtype")
    check(fn, x, **tolerance(dtype))


@pytest.mark.parametrize("fn", [torch.logit, torch.erfinv, torch.log, torch.sqrt])
def test_unary_domain_edges(fn):
    check(fn, torch.tensor([-1.5, -1.0, 0.0, 0.25, 0.5, 1.0, 1.5]))


def test_unary_int_and_bool_inputs():
    b = torch.tensor([True, False, True])
    for fn in (torch.sign, torch.exp, torch.sqrt, torch.isnan, torch.logical_not,
               torch.bitwise_not, torch.signbit, torch.nan_to_num):
        check(fn, b)
    for dtype in (torch.uint8, torch.int8, torch.int32):
        check(torch.neg, ints(dtype, low=0 if dtype == torch.uint8 else -9))
        check(torch.abs, ints(dtype, low=0 if dtype == torch.uint8 else -9))


@pytest.mark.parametrize("fn", [torch.exp, torch.log, torch.sqrt, torch.rsqrt, torch.sin, torch.tanh, torch.sigmoid,
                                torch.reciprocal, torch.abs, torch.sgn, torch.neg, torch.angle, torch.conj_physical,
                                torch.isnan, torch.isinf, torch.expm1, torch.log1p, torch.asinh])
def test_unary_complex(fn):
    x = torch.randn(3, 4, dtype=torch.complex64)
    x[0, 0] = 0
    check(fn, x, rtol=1e-5, atol=1e-5)


def test_rounding_half_to_even_and_decimals():
    x = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 1.2345, -7.25, 1e20, NAN])
    check(torch.round, x)
    for decimals in (0, 1, 2, -1):
        check(partial(torch.round, decimals=decimals), x)
        check(partial(torch.round, decimals=decimals), x.double())
    check(torch.frac, torch.tensor([-2.75, 2.75, -0.0, INF, NAN]))


BINARY = [torch.add, torch.sub, torch.mul, torch.div, torch.remainder, torch.fmod, torch.floor_divide, torch.atan2,
          torch.maximum, torch.minimum, torch.fmax, torch.fmin, torch.hypot, torch.copysign, torch.nextafter,
          torch.logaddexp, torch.logaddexp2, torch.xlogy, torch.special.xlog1py, torch.eq, torch.ne, torch.lt,
          torch.le, torch.gt, torch.ge, torch.logical_and, torch.logical_or, torch.logical_xor, torch.heaviside]
FLOAT_ONLY = {torch.hypot, torch.nextafter, torch.logaddexp, torch.logaddexp2, torch.heaviside}


@pytest.mark.parametrize("fn", BINARY, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
def test_binary(fn, dtype):
    if dtype == torch.int64:
        if fn in FLOAT_ONLY:
            pytest.skip("float-only op")
        a, b = ints(), ints(low=1)
        b[0] *= -1  # negative divisors exercise the sign rules
    else:
        a, b = floats(dtype), floats(dtype).flip(0)
        if fn in (torch.remainder, torch.fmod, torch.floor_divide):
            b = b.abs() + 0.5  # away from zero divisors, where bfloat16 rounding changes the quotient
            b[0] *= -1
    check(fn, a, b, **tolerance(dtype))


@pytest.mark.parametrize("fn", [torch.add, torch.sub, torch.mul, torch.div, torch.remainder, torch.fmod, torch.pow,
                                torch.eq, torch.lt, torch.ge, torch.maximum, torch.atan2, torch.bitwise_and])
def test_binary_mixed_dtypes_and_broadcast(fn):
    i, f = ints(shape=(3, 1), low=1), floats(shape=(1, 4), special=False)
    d = floats(torch.float64, (4,), special=False)
    if fn is torch.bitwise_and:
        check(fn, i, ints(torch.int32, (4,)))
        check(fn, i, torch.tensor([True, False, True, True]))
        return
    check(fn, i, f, rtol=1e-5, atol=1e-5)
    check(fn, f, d, rtol=1e-5, atol=1e-5)
    check(fn, i, torch.tensor(3, dtype=torch.int32))


def test_python_scalars():
    x, i = floats(special=False), ints()
    check(lambda t: t + 2, x)
    check(lambda t: 2 - t, x)
    check(lambda t: t * 2.5, i)
    check(lambda t: 3 / t, x)
    check(lambda t: t / 2, i)
    check(lambda t: t // 4, i)
    check(lambda t: t % -4, i)
    check(lambda t: -7 % t, ints(low=1))
    check(lambda t: t ** 2, i)
    check(lambda t: 2 ** t, ints(low=0))
    check(lambda t: 2.5 ** t, x)
    check(lambda t: t ** 0.5, x)
    check(lambda t: t > 1.5, i)
    check(lambda t: t == 3, x)
    check(lambda t: torch.add(t, 1, alpha=3), i)
    check(lambda t, u: torch.sub(t, u, alpha=0.5), x, x.flip(0))
    check(lambda t: torch.rsub(t, 1.5), i)
    check(lambda t: torch.fmod(t, -3), i)
    check(lambda t: t & 6, i)
    check(lambda t: t | True, torch.tensor([True, False]))
    check(lambda t: t + True, torch.tensor([True, False]))
    check(lambda t: t * 3, torch.tensor([True, False]))
    check(lambda t: torch.xlogy(2, t), x.abs())
    check(lambda t: torch.copysign(t, -1), i)
    check(lambda t: torch.remainder(5, t), ints(low=1))


def test_bool_arithmetic():
    a, b = torch.tensor([True, True, False, False]), torch.tensor([True, False, True, False])
    for fn in (torch.add, torch.mul, torch.maximum, torch.minimum, torch.eq, torch.logical_xor, torch.bitwise_xor,
               torch.div):
        check(fn, a, b)
    check(torch.where, a, b, a)


def test_integer_division_sign_rules():
    a = torch.tensor([7, -7, 7, -7, 0, 5, -5, 1])
    b = torch.tensor([2, 2, -2, -2, 3, -1, 3, -9])
    for mode in (None, "trunc", "floor"):
        divide = partial(torch.div, rounding_mode=mode)
        check(divide, a, b)
        check(lambda x, divide=divide: divide(x, -3), a)
        check(lambda x, divide=divide: divide(x, 2.5), a)
    check(torch.floor_divide, a, b)
    check(torch.remainder, a, b)
    check(torch.fmod, a, b)
    check(lambda x, y: torch.remainder(x, y), a.to(torch.int8), b.to(torch.int8))


def test_float_division_modes_edge_cases():
    a = torch.tensor([7.0, -7.0, 7.0, -7.0, 0.0, -0.0, 1.0, -1.0, INF, NAN, 5.0, 0.3])
    b = torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 0.0, 0.0, 2.0, 1.0, INF, 0.1])
    for dtype in (torch.float32, torch.float64):
        for mode in (None, "trunc", "floor"):
            divide = partial(torch.div, rounding_mode=mode)
            check(divide, a.to(dtype), b.to(dtype))
            check(lambda x, divide=divide: divide(x, -0.7), a.to(dtype))
        check(torch.remainder, a.to(dtype), b.to(dtype))
        check(torch.fmod, a.to(dtype), b.to(dtype))
        check(torch.floor_divide, a.to(dtype), b.to(dtype))


def test_pow():
    i = torch.tensor([2, -2, 1, -1, 0, 3, 3])
    e = torch.tensor([-1, -1, -3, -3, 0, 40, 2])
    check(torch.pow, i, e)  # integer overflow wraps; negative powers of |base| > 1 are 0
    check(lambda x: torch.pow(x, 3), i)
    check(lambda x: torch.pow(x, 0.5), i)
    check(lambda x: torch.pow(3, x), e.clamp(min=0))
    check(lambda x: torch.pow(2.0, x), e)
    x = torch.tensor([-2.0, -0.5, 0.0, -0.0, 0.5, 2.0, INF, -INF, NAN])
    for exponent in (0, 1, 2, 3, -1, -2, 0.5, -0.5, 1.5, INF, NAN):
        check(lambda t, exponent=exponent: torch.pow(t, exponent), x)
    check(torch.pow, x, x.flip(0))
    check(lambda t: torch.pow(t, 2), x.to(torch.bfloat16))
    check(torch.pow, torch.randn(4, dtype=torch.complex128), torch.randn(4, dtype=torch.complex128))
    check(lambda t: torch.pow(t, 2), torch.randn(4, dtype=torch.complex64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.int8, torch.bool])
def test_bitwise_and_shifts(dtype):
    if dtype == torch.bool:
        a, b = torch.rand(10) > 0.5, torch.rand(10) > 0.5
    else:
        a, b = ints(dtype, (10,), 0 if dtype == torch.uint8 else -100, 100), ints(dtype, (10,), 0, 100)
    for fn in (torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor):
        check(fn, a, b)
        check(lambda x, fn=fn: fn(x, 5 if dtype != torch.bool else True), a)
    check(torch.bitwise_not, a)
    if dtype != torch.bool:
        bits = a.element_size() * 8
        s = torch.tensor([0, 1, 3, bits - 1, bits, bits + 5, 2, 1, 0, 4], dtype=dtype)
        check(lambda x, y: x << y, a, s)
        check(lambda x, y: x >> y, a, s)
        check(lambda x: torch.bitwise_left_shift(x, 2), a)
        check(lambda x: torch.bitwise_right_shift(x, 2), a)
        check(lambda y: torch.bitwise_left_shift(3, y), s)


def test_shift_by_negative_amount():
    check(lambda x, y: x << y, torch.tensor([5, -5]), torch.tensor([-1, -2]))
    check(lambda x, y: x >> y, torch.tensor([5, -5]), torch.tensor([-1, -2]))


def test_comparisons_with_nan_and_scalars():
    x = torch.tensor([1.0, NAN, -INF, 2.0, 0.0])
    y = torch.tensor([1.0, NAN, -INF, 3.0, -0.0])
    for fn in (torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge):
        check(fn, x, y)
        check(lambda t, fn=fn: fn(t, 1.0), x)
        check(lambda t, fn=fn: fn(t, 2), ints())
        check(lambda t, fn=fn: fn(t, 2.5), ints())
    c = torch.randn(4, dtype=torch.complex64)
    check(torch.eq, c, c.clone())
    check(torch.ne, c, c.conj_physical())


def test_logical():
    a = torch.tensor([0.0, 1.5, NAN, -2.0])
    b = torch.tensor([3, 0, 0, 7])
    for fn in (torch.logical_and, torch.logical_or, torch.logical_xor):
        check(fn, a, b)
    check(torch.logical_not, a)
    check(torch.logical_not, b)
    check(lambda x: torch.logical_and(x, x), torch.tensor([1 + 0j, 0j]))


def test_maximum_minimum_nan_propagation():
    a = torch.tensor([1.0, NAN, NAN, -0.0, 2.0, -INF])
    b = torch.tensor([NAN, 1.0, NAN, 0.0, 1.0, INF])
    for fn in (torch.maximum, torch.minimum, torch.fmax, torch.fmin):
        check(fn, a, b)
        check(fn, ints(), ints())
    check(torch.maximum, torch.tensor([True, False]), torch.tensor([False, False]))


def test_clamp():
    x = torch.tensor([-3.0, -1.0, 0.0, 0.5, 2.0, NAN, INF, -INF])
    check(lambda t: t.clamp(-1, 1), x)
    check(lambda t: t.clamp(min=0), x)
    check(lambda t: t.clamp(max=0.25), x)
    check(lambda t: t.clamp(1, -1), x)  # min > max: everything becomes max
    check(lambda t: t.clamp(NAN, 1.0), x)
    check(lambda t: torch.clamp_min(t, 0.5), x)
    check(lambda t: torch.clamp_max(t, 0.5), x)
    i = ints()
    check(lambda t: t.clamp(-2, 3), i)
    check(lambda t: t.clamp(-2.5, 3.5), i)  # promotes to float
    lo, hi = torch.full((8,), -0.5), torch.tensor([1.0, NAN, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    check(lambda t, a, b: torch.clamp(t, a, b), x, lo, hi)
    check(lambda t, a: torch.clamp(t, min=a), x, lo)
    check(lambda t, b: torch.clamp(t, max=b), x, hi)
    check(lambda t, a: torch.clamp_min(t, a), x, lo)
    check(lambda t, b: torch.clamp_max(t, b), x, hi)
    check(lambda t, a: torch.clamp(t, a, None), i, ints(shape=(1,)))


def test_where_and_masked_fill():
    cond = torch.rand(3, 4) > 0.5
    a, b, i = floats(shape=(3, 4)), floats(shape=(1, 4)), ints(shape=(3, 4))
    check(torch.where, cond, a, b)
    check(torch.where, cond, i, a)
    check(lambda c, x: torch.where(c, x, 2.5), cond, i)
    check(lambda c, x: torch.where(c, 0, x), cond, a)
    check(lambda c, x: torch.where(c, x, 7), cond, i)
    check(lambda x, m: x.masked_fill(m, -1.5), a, cond)
    check(lambda x, m: x.masked_fill(m, 3), i, cond)
    check(lambda x, m: x.masked_fill(m, NAN), a.double(), cond)
    check(lambda x, m, v: x.masked_fill(m, v), a, cond[0], torch.tensor(-2.0))
    check(lambda x, m: x.masked_fill(m, True), torch.zeros(3, 4, dtype=torch.bool), cond)


def test_lerp_addcmul_addcdiv():
    a, b, w = floats(special=False), floats(special=False), torch.rand(3, 5) * 1.4 - 0.2
    for weight in (0.0, 0.25, 0.5, 1.0, 1.7):
        check(lambda x, y, weight=weight: torch.lerp(x, y, weight), a, b)
    check(torch.lerp, a, b, w)
    check(torch.lerp, a.to(torch.bfloat16), b.to(torch.bfloat16), w.to(torch.bfloat16), rtol=2e-2, atol=2e-2)
    c = floats(special=False)
    check(lambda x, y, z: torch.addcmul(x, y, z, value=0.5), a, b, c)
    check(lambda x, y, z: torch.addcdiv(x, y, z, value=-2), a, b, c)
    check(lambda x, y, z: torch.addcmul(x, y, z, value=3), ints(), ints(), ints())
    check(lambda x, y, z: torch.addcmul(x, y, z), a, b[:1], c[:, :1])


def test_nan_to_num():
    x = torch.tensor([NAN, INF, -INF, 1.5, -0.0])
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        check(torch.nan_to_num, x.to(dtype))
        check(lambda t: torch.nan_to_num(t, nan=1.0, posinf=2.0, neginf=-3.0), x.to(dtype))
        check(lambda t: torch.nan_to_num(t, posinf=1e30), x.to(dtype))
    check(torch.nan_to_num, torch.tensor([complex(NAN, INF), complex(1, -INF)]))


def test_misc_binary():
    check(torch.gcd, torch.tensor([12, -18, 0, 7, 0]), torch.tensor([8, 12, 5, -3, 0]))
    check(torch.lcm, torch.tensor([4, -6, 0, 7]), torch.tensor([6, 4, 5, -3]))
    check(torch.heaviside, torch.tensor([-1.0, 0.0, 2.0, NAN]), torch.tensor([0.5, 0.5, 0.5, 0.5]))
    check(torch.xlogy, torch.tensor([0.0, 0.0, 2.0, 1.0]), torch.tensor([0.0, NAN, 3.0, -1.0]))
    check(torch.nextafter, torch.tensor([1.0, 0.0, -1.0]), torch.tensor([2.0, -1.0, -INF]))


def logit_eps(x):
    return torch.logit(x, eps=0.1)


ACTIVATIONS = [
    F.relu, F.relu6, F.gelu, lambda x: F.gelu(x, approximate="tanh"), F.silu, F.mish, F.hardtanh,
    lambda x: F.hardtanh(x, -0.5, 2.0), F.hardsigmoid, F.hardswish, F.leaky_relu, lambda x: F.leaky_relu(x, 0.2),
    F.elu, lambda x: F.elu(x, alpha=0.5), F.selu, F.celu, lambda x: F.celu(x, alpha=2.0), F.softplus,
    lambda x: F.softplus(x, beta=2, threshold=3), lambda x: F.threshold(x, 0.5, -2.0), torch.sigmoid, torch.tanh,
    F.softshrink, F.hardshrink, logit_eps, torch.logit,
]


@pytest.mark.parametrize("fn", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_activation_forward_and_grad(fn, dtype):
    x = floats(dtype, (4, 6), special=False) * 3
    x.view(-1)[:4] = torch.tensor([0.0, 3.0, -3.0, 1.0])  # kinks of relu6, hardsigmoid, hardswish
    if fn in (torch.logit, logit_eps):
        x = torch.rand(4, 6, dtype=dtype) * 0.98 + 0.01  # gradients compare without NaNs
    check(fn, x, grad=True, **tolerance(dtype))


def test_backward_ops_directly():
    """The backward kernels at their edges, where autograd's comparison of gradients can't look (NaN)."""
    g, x = torch.randn(9, dtype=torch.float64), torch.tensor([-0.5, 0.0, 0.05, 0.5, 0.95, 1.0, 1.5, NAN, -3.0],
                                                                dtype=torch.float64)
    check(lambda a, b: torch.ops.aten.logit_backward(a, b), g, x)
    # With eps, CPU's vector path answers NaN inputs by the host processor (0 on some, NaN on others):
    # the reference there is CUDA's kernel and CPU's scalar path, where a NaN input's gradient is NaN.
    finite = ~x.isnan()
    check(lambda a, b: torch.ops.aten.logit_backward(a, b, 0.1), g[finite], x[finite])
    at_nan = torch.ops.aten.logit_backward(g[~finite].to("neuron"), x[~finite].to("neuron"), 0.1)
    assert at_nan.isnan().all()
    check(lambda a, b: torch.ops.aten.hardswish_backward(a, b), g, x * 6)
    check(lambda a, b: torch.ops.aten.hardsigmoid_backward(a, b), g, x * 6)
    check(lambda a, b: torch.ops.aten.threshold_backward(a, b, 0.5), g, x)
    # PyTorch's CPU kernel zeroes the gradient at NaN in its vectorized loop only: compare off NaN
    check(lambda a, b: torch.ops.aten.hardtanh_backward(a, b, -0.5, 1.0), g, x.nan_to_num())
    check(lambda a, b: torch.ops.aten.softplus_backward(a, b, 2.0, 1.0), g, x)
    check(lambda a, b: torch.ops.aten.leaky_relu_backward(a, b, 0.1, False), g, x)
    check(lambda a, b: torch.ops.aten.elu_backward(a, 1.5, 2.0, 0.5, True, b), g, x)
    check(lambda a, b: torch.ops.aten.elu_backward(a, 1.5, 2.0, 0.5, False, b), g, x)
    for approximate in ("none", "tanh"):
        check(partial(torch.ops.aten.gelu_backward, approximate=approximate), g, x)
    check(lambda a, b: torch.ops.aten.sigmoid_backward(a, b), g, x)
    check(lambda a, b: torch.ops.aten.tanh_backward(a, b), g, x)
    check(lambda a, b: torch.ops.aten.softshrink_backward(a, b, 0.5), g, x.nan_to_num())
    check(lambda a, b: torch.ops.aten.hardshrink_backward(a, b, 0.5), g, x.nan_to_num())
    half = (g.to(torch.bfloat16), x.to(torch.bfloat16))
    check(lambda a, b: torch.ops.aten.gelu_backward(a, b), *half, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("fn", [F.relu, F.gelu, F.silu, F.mish, F.hardswish, F.elu, F.softplus, F.leaky_relu])
def test_activation_half_and_nan(fn):
    # PyTorch's vectorized CPU gelu gives NaN at ±inf (its scalar loop gives ±inf, 0): leave infinities out
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = floats(dtype)
        x[x.isinf()] = 5.0
        check(fn, x, **tolerance(dtype))


def test_threshold_and_relu_on_ints():
    check(F.relu, ints())
    check(lambda x: F.threshold(x, 2, -7), ints())
    check(lambda x: F.threshold(x, 0.5, 3), ints())


def test_inplace_activations():
    for fn in (F.relu_, lambda x: F.elu_(x), lambda x: F.hardtanh_(x), lambda x: F.leaky_relu_(x),
               lambda x: F.threshold_(x, 0.1, 2.0), lambda x: F.hardswish(x, inplace=True),
               lambda x: F.silu(x, inplace=True), lambda x: F.mish(x, inplace=True), torch.sigmoid_,
               lambda x: F.celu_(x), torch.tanh_):
        check(lambda x, fn=fn: fn(x.clone()), floats(special=False))


DIFFERENTIABLE = [
    torch.sqrt, torch.rsqrt, torch.reciprocal, torch.exp, torch.exp2, torch.expm1, torch.log, torch.log2, torch.log10,
    torch.log1p, torch.sin, torch.cos, torch.tan, torch.asin, torch.acos, torch.atan, torch.sinh, torch.cosh,
    torch.asinh, torch.acosh, torch.atanh, torch.erf, torch.erfc, torch.erfinv, torch.abs, torch.neg, torch.sign,
    torch.floor, torch.round, torch.frac, torch.lgamma, torch.sinc, torch.deg2rad, torch.nan_to_num,
]


@pytest.mark.parametrize("fn", DIFFERENTIABLE, ids=lambda f: f.__name__)
def test_unary_grad(fn):
    x = torch.rand(3, 4, dtype=torch.float64) * 0.8 + 0.1  # inside every domain
    if fn is torch.acosh:
        x = x + 1
    check(fn, x, grad=True)


BINARY_GRAD = [
    torch.add, torch.sub, torch.mul, torch.div, torch.pow, torch.atan2, torch.maximum, torch.minimum, torch.fmax,
    torch.fmin, torch.hypot, torch.remainder, torch.fmod, torch.xlogy, torch.copysign, torch.logaddexp,
    lambda a, b: torch.div(a, b, rounding_mode="floor"), lambda a, b: torch.lerp(a, b, 0.3),
    lambda a, b: torch.where(a > b, a, b), lambda a, b: torch.clamp(a, 0.3, 0.6) * b,
    lambda a, b: torch.clamp(a, b, None), lambda a, b: torch.addcmul(a, a, b, value=2),
    lambda a, b: torch.addcdiv(a, a, b, value=2), lambda a, b: torch.add(a, b, alpha=-3),
    lambda a, b: a.masked_fill(b > 0.5, 0.0), lambda a, b: torch.lerp(a, b, b),
]


@pytest.mark.parametrize("fn", BINARY_GRAD)
def test_binary_grad(fn):
    a, b = torch.rand(3, 4, dtype=torch.float64) + 0.1, torch.rand(3, 4, dtype=torch.float64) + 0.1
    check(fn, a, b, grad=True)


def test_complex_arithmetic():
    a, b = torch.randn(3, 4, dtype=torch.complex64), torch.randn(3, 4, dtype=torch.complex64)
    for fn in (torch.add, torch.sub, torch.mul, torch.div, torch.eq):
        check(fn, a, b, rtol=1e-5, atol=1e-5)
    check(lambda x: x * 2.5 + 1j, a)
    check(lambda x, y: x * y, a, floats(special=False)[:, :4])
    check(torch.where, torch.rand(3, 4) > 0.5, a, b)
    a, b = a.to(torch.complex128), b.to(torch.complex128)
    check(lambda x, y: torch.addcmul(x, x, y, value=2j), a, b)
    check(lambda x: torch.sigmoid(x), a, grad=True)
    check(lambda x: (x * x).abs(), a, grad=True)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "remainder", "fmod", "pow", "atan2", "maximum",
                                "hypot", "bitwise_and", "eq", "lt", "logical_or", "copysign"])
def test_inplace_and_out(op):
    fn = getattr(torch, op)
    dtype = torch.int64 if op == "bitwise_and" else torch.float32
    base = ints() if dtype == torch.int64 else floats(special=False).abs() + 0.5
    other = ints() if dtype == torch.int64 else floats(special=False).abs() + 0.5
    method = getattr(torch.Tensor, op + "_", None)
    if method is not None:
        check(lambda a, b: method(a.clone(), b), base, other, rtol=1e-5, atol=1e-5)
        check(lambda a, b: method(a.t().clone().t(), b), base, other, rtol=1e-5, atol=1e-5)
    out_dtype = torch.bool if op in ("eq", "lt", "logical_or") else dtype
    check(lambda a, b: fn(a, b, out=torch.empty(3, 5, dtype=out_dtype, device=a.device)), base, other,
          rtol=1e-5, atol=1e-5)
    # out= of the wrong size is resized; a strided out= is written through its view
    check(lambda a, b: fn(a, b, out=torch.empty(0, dtype=out_dtype, device=a.device)), base, other,
          rtol=1e-5, atol=1e-5)
    check(lambda a, b: fn(a, b, out=torch.zeros(5, 3, dtype=out_dtype, device=a.device).t()), base, other,
          rtol=1e-5, atol=1e-5)


def test_inplace_unary_and_scalar_variants():
    x = floats(special=False)
    for name in ("exp_", "sqrt_", "abs_", "neg_", "floor_", "round_", "sigmoid_", "clamp_", "relu_", "nan_to_num_",
                 "sign_", "sgn_", "frac_", "erf_", "reciprocal_", "logical_not_", "trunc_"):
        args = (-0.5, 0.5) if name == "clamp_" else ()
        check(lambda t, name=name, args=args: getattr(t.clone(), name)(*args), x)
    check(lambda t: t.clone().add_(2, alpha=3), x)
    check(lambda t: t.clone().mul_(-1.5), x)
    check(lambda t: t.clone().div_(2, rounding_mode="floor"), ints())
    check(lambda t: t.clone().pow_(2), ints())
    check(lambda t: t.clone().masked_fill_(t > 0, 0.0), x)
    check(lambda t: t.clone().clamp_min_(0.0), x)
    check(lambda t: t.clone().lerp_(torch.ones_like(t), 0.5), x)
    check(lambda t: t.clone().addcmul_(t, t, value=2), x)
    check(lambda t: t.clone().bitwise_left_shift_(2), ints())
    with pytest.raises(RuntimeError):
        ints().to("neuron").add_(1.5)  # result type float can't be cast to int64 in place
    with pytest.raises(RuntimeError):
        torch.exp(ints().to("neuron"), out=torch.empty(3, 5, dtype=torch.int64, device="neuron"))


def test_inplace_aliasing_inputs():
    # the written tensor is also every input: inputs are read before outputs are written
    check(lambda c: c.mul_(c), floats(special=False))
    check(lambda c: torch.addcmul(c, c, c, value=2, out=c), floats(special=False))
    check(lambda c: torch.where(c > 0, c, -c, out=c), floats(special=False))


@pytest.mark.parametrize("view", ["transposed", "stepped", "expanded", "offset"])
def test_non_contiguous(view):
    def make(t):
        if view == "transposed":
            return t.t()
        if view == "stepped":
            return t[::2, ::3]
        if view == "expanded":
            return t[:1].expand(3, 5)
        return t[1:, 2:]

    a, b = floats(shape=(5, 5), special=False), floats(shape=(5, 5), special=False)
    for fn in (torch.add, torch.mul, torch.maximum, torch.atan2, torch.lt, torch.remainder,
               lambda x, y: torch.where(x > 0, x, y), lambda x, y: torch.clamp(x, y, None)):
        check(lambda x, y, fn=fn: fn(make(x), make(y)), a, b)
    for fn in (torch.exp, torch.relu, torch.sign, torch.round, F.gelu, torch.nan_to_num):
        check(lambda x, fn=fn: fn(make(x)), a)
    check(lambda x: make(x).exp(), a, grad=True)
    if view != "expanded":  # writing to an expanded tensor is an error
        check(lambda x, y: make(x.clone()).mul_(make(y)), a, b)


def test_zero_dim_and_empty():
    s, e = torch.tensor(1.5), torch.empty(0, 3)
    for fn in (torch.exp, torch.neg, torch.round, torch.isnan, F.relu, F.gelu):
        check(fn, s)
        check(fn, e)
    for fn in (torch.add, torch.mul, torch.maximum, torch.eq, torch.div):
        check(fn, s, s)
        check(fn, e, e)
        check(fn, e, s)
        check(fn, floats(special=False), s)
    check(lambda x: x + torch.tensor(2.0), floats())  # 0-dim CPU tensor acts as a scalar
    check(lambda x: x * torch.tensor(2, dtype=torch.int32), ints(torch.int16))
    check(lambda x: x.exp(), torch.tensor(0.5), grad=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8, torch.float16, torch.bfloat16,
                                   torch.complex128])
def test_more_dtypes(dtype):
    if dtype.is_floating_point:
        a, b = floats(dtype, special=False), floats(dtype, special=False)
        tol = tolerance(dtype)
    elif dtype.is_complex:
        a, b = torch.randn(3, 5, dtype=dtype), torch.randn(3, 5, dtype=dtype)
        tol = {}
    else:
        a, b = ints(dtype, low=0 if dtype == torch.uint8 else -9), ints(dtype, low=1)
        tol = {}
    for fn in (torch.add, torch.sub if dtype != torch.uint8 else torch.mul, torch.mul, torch.div, torch.eq,
               torch.ne):
        check(fn, a, b, **tol)
    check(lambda x: x * 3, a, **tol)
    check(lambda x: x + 1.5, a, **tol)
    check(torch.exp, a, **tol)


def test_special_and_complex_builders():
    x = torch.tensor([0.5, 1.0, 2.5, 7.0, -0.0, -1.5, INF, NAN], dtype=torch.float64)
    for n in (0, 1, 3):
        check(partial(torch.polygamma, n), x)
    for p in (1, 3):
        check(lambda t, p=p: torch.mvlgamma(t, p), torch.tensor([2.5, 3.0, 10.0]))
    grid = torch.tensor([0.0, 0.5, 2.5, 7.0, INF, NAN, -1.0], dtype=torch.float64)
    a, z = grid.repeat_interleave(7), grid.repeat(7)  # every pair, edges included
    check(torch.igamma, a, z)
    check(torch.igammac, a, z)
    check(torch.complex, x, x.flip(0))
    check(torch.polar, x.abs(), x.flip(0))
    check(torch.ldexp, x, torch.tensor([1, 2, -3, 0, 5, 1, 1, 4]))
    check(torch.frexp, x)
    check(torch.frexp, x.float())


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_exp_of_complex_infinities_and_nans(dtype):
    # every pair of special and ordinary parts: C99's values (CPU's std::exp), signs of zero included
    parts = [0.0, -0.0, 1.0, -2.5, INF, -INF, NAN]
    re, im = torch.tensor(parts).repeat_interleave(len(parts)), torch.tensor(parts).repeat(len(parts))
    z = torch.complex(re, im).to(dtype)
    expected = torch.exp(z)
    actual = torch.exp(z.to("neuron")).cpu()
    torch.testing.assert_close(actual, expected, equal_nan=True)
    for part in (torch.real, torch.imag):  # which NaNs and which signed zeros, exactly
        assert torch.equal(part(actual).isnan(), part(expected).isnan())
        assert torch.equal(part(actual).signbit() | part(actual).isnan(), part(expected).signbit() | part(expected).isnan())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_frexp_is_exact_over_the_whole_range(dtype):
    # every binade from the subnormals to the largest values, zeros and specials: exact as on CPU
    info = torch.finfo(dtype)
    g = torch.Generator().manual_seed(0)
    scale = torch.exp2(torch.randint(-1080, 1030, (4000,), generator=g).double())
    wide = (torch.randn(4000, generator=g, dtype=torch.float64) * scale).clamp(-info.max, info.max)
    special = torch.tensor([0.0, -0.0, INF, -INF, NAN, 1.0, 0.5, 2.0, -0.75, info.max, info.tiny, info.eps],
                           dtype=torch.float64)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    subnormals = torch.arange(1, 64, dtype=bits).view(dtype)  # the smallest ones, bit by bit
    x = torch.cat([wide.to(dtype), special.to(dtype), subnormals, -subnormals, subnormals * 7])
    mantissa, exponent = torch.frexp(x)
    m, e = (t.cpu() for t in torch.frexp(x.to("neuron")))
    assert torch.equal(m.isnan(), mantissa.isnan())
    assert torch.equal(m[~m.isnan()], mantissa[~mantissa.isnan()])
    assert torch.equal(e, exponent)


def test_complex_parts_and_conj():
    c = torch.randn(3, 4, dtype=torch.complex64)
    check(lambda x: x.real * 2 + x.imag, c)
    check(lambda x: torch.view_as_complex(torch.view_as_real(x) * 2), c)
    check(lambda x: (x.real.mul_(3), x)[1], c)  # written through a float view of complex storage
    check(lambda x: x.conj_physical_(), c)
    check(lambda x: torch.conj_physical(x, out=torch.empty_like(x)), c)
    check(lambda x: torch.conj_physical(x), floats())


def test_inplace_shift_operators():
    def shift(x, y):
        x <<= 2
        x >>= y
        x <<= y
        return x

    check(shift, ints(), ints(low=0, high=5))


@pytest.mark.parametrize("invert", [False, True])
def test_isin_matches_cpu(invert):
    e, t = torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([2, 6, 9])
    check(lambda a, b: torch.isin(a, b, invert=invert), e, t)
    check(lambda a: torch.isin(a, 5, invert=invert), e)
    check(lambda a: torch.isin(a, torch.empty(0, dtype=torch.int64).to(a.device)), e)
    out = torch.empty(0, dtype=torch.bool, device="neuron")
    torch.isin(e.to("neuron"), t.to("neuron"), invert=invert, out=out)
    torch.testing.assert_close(out.cpu(), torch.isin(e, t, invert=invert))


def test_factory_out_overloads_run_on_neuron():
    out = torch.empty(0, device="neuron")
    torch.testing.assert_close(torch.arange(1, 7, 2, out=out).cpu(), torch.arange(1.0, 7, 2))
    torch.testing.assert_close(torch.linspace(0, 1, 5, out=out).cpu(), torch.linspace(0, 1, 5))


def test_inplace_overloads_named_unlike_their_functional():
    """floor_divide_.Tensor computes floor_divide.default, pow_.Tensor computes pow.Tensor_Tensor."""
    a, b = torch.randn(6) * 4, torch.rand(6) + 0.5
    check(lambda a, b: a.clone().floor_divide_(b), a, b)
    check(lambda a, b: a.clone().pow_(b), a.abs() + 0.1, b)


@pytest.mark.parametrize("fn", [torch.special.i0e, torch.special.i1, torch.special.i1e, torch.special.log_ndtr,
                                torch.special.modified_bessel_i0, torch.special.modified_bessel_i1,
                                torch.special.spherical_bessel_j0])
def test_special_functions(fn):
    check(fn, torch.cat([torch.linspace(-6, 6, 25), torch.zeros(1)]), rtol=1e-4, atol=1e-6)


def test_ndtri_and_complex_broadcast():
    check(torch.special.ndtri, torch.linspace(0.01, 0.99, 17), rtol=1e-4, atol=1e-6)
    check(torch.complex, torch.randn(4), torch.tensor(2.0))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_polygamma_negative_arguments(n):
    """JAX's series is wrong below zero; the lowering shifts the argument up first."""
    x = torch.tensor([-8.478, -3.3, -0.7, 0.4, 2.5])
    check(lambda t: torch.polygamma(n, t), x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [2, 4, 6])
def test_polygamma_float32_where_terms_cancel(n):
    """At negative half-integers even orders are tiny sums of large terms of opposite sign; CPU sums
    in double for float32 (its acc_type), a float32 sum was 0.2-30x off (relative) there."""
    x = torch.cat([torch.arange(-10, 0) + 0.5, torch.linspace(-12.9, 12.9, 200)])
    check(lambda t: torch.polygamma(n, t), x, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_digamma_and_trigamma_follow_cpu_near_poles(dtype):
    # CPU's calc_digamma / calc_trigamma (reflection below 0 or 1/2, recurrence, asymptotic series):
    # the same steps agree in float32 near the poles, where XLA's series was ~2e-5 away
    x = torch.cat([torch.linspace(-9.99, 9.99, 2001), torch.tensor([-0.0, 0.0, -3.0, 10.0, 1e20, INF, -INF, NAN])])
    check(torch.digamma, x.to(dtype), rtol=1e-5, atol=1e-5)
    check(lambda t: torch.polygamma(0, t), x.to(dtype), rtol=1e-5, atol=1e-5)
    check(lambda t: torch.polygamma(1, t), x.to(dtype), rtol=1e-6, atol=1e-6)
    check(torch.digamma, torch.linspace(-4.9, 4.9, 50, dtype=dtype), grad=True, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_polygamma_poles(n):
    # 0, -1, -2... are poles: (-1)^(n+1) inf on CPU (bool and integer samples hit 0 exactly)
    check(lambda t: torch.polygamma(n, t), torch.tensor([0.0, -0.0, -1.0, -3.0, 1.0]), rtol=1e-4, atol=1e-4)
    check(lambda t: torch.polygamma(n, t), torch.tensor([False, True]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
                                  "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
                                  "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l",
                                  "legendre_polynomial_p"])
def test_orthogonal_polynomials(name):
    fn = getattr(torch.special, name)
    x = torch.tensor([-1.5, -1.0, -0.3, 0.0, 0.4, 1.0, 2.0])
    check(fn, x, torch.tensor([-1, 0, 1, 2, 3, 5, 9]), rtol=1e-4, atol=1e-4)  # n per element
    check(lambda t: fn(t, 2.7), x, rtol=1e-4, atol=1e-4)  # n truncates, as on CPU


def test_zeta_entr_and_eigvals():
    check(torch.special.zeta, torch.tensor([2.0, 3.0, 0.5, -1.0, 4.5]), torch.tensor([1.0, 2.0, -0.5, 2.0, -2.5]),
          rtol=1e-4, atol=1e-5)
    check(lambda q: torch.special.zeta(2.0, q), torch.tensor([1.0, 2.0, 3.5]), rtol=1e-4, atol=1e-5)
    check(torch.special.entr, torch.tensor([-1.0, 0.0, 0.5, 2.0]))
    check(torch.linalg.eigvals, torch.tensor([[2.0, 1.0], [0.5, 3.0]]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("source", [torch.complex64, torch.float32, torch.int64], ids=str)
@pytest.mark.parametrize("op", [torch.abs, torch.angle], ids=["abs", "angle"])
def test_abs_and_angle_into_outs_of_other_dtypes(op, source):
    # a complex input's magnitudes (angles) into a complex out, or a real one its real dtype casts to
    x = torch.tensor([3 + 4j, -1j, 0, -2], dtype=torch.complex64)
    x = x if source.is_complex else x.real.to(source)
    for out_dtype in (torch.complex64, torch.complex128, torch.float64, torch.float32, torch.int64):
        outcomes = []
        for device in ("cpu", "neuron"):
            try:
                outcomes.append(op(x.to(device), out=torch.empty(0, dtype=out_dtype, device=device)).cpu())
            except RuntimeError as e:
                outcomes.append(str(e))
        if isinstance(outcomes[0], str):
            assert outcomes[1] == outcomes[0]
        else:
            torch.testing.assert_close(outcomes[1], outcomes[0])
