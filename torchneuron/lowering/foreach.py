"""Lowerings: _foreach_* ops (what torch.optim runs with foreach=True).

Each op maps an elementwise function over its tensor list. `other` is a matching list, one
Scalar, a Scalar list, or one tensor. Scalars arrive as float64/int64 0-d arrays: they are
cast to each tensor's computation dtype, so a float32 list computes in float32 as on CPU.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch

from ..runtime.dtypes import to_jax
from . import aten, lowers


def _floating(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating)


def _default_float():
    return to_jax(torch.get_default_dtype())


def _compute_dtype(x, other, to_float=False):
    """PyTorch's promotion of tensor x with `other`: a tensor of the same rank class promotes fully;
    a scalar or 0-d tensor only lifts x to its category (int -> float)."""
    dtype = x.dtype
    if other is not None:
        if jnp.ndim(other) > 0:
            dtype = jnp.promote_types(dtype, other.dtype)
        elif _floating(other.dtype) and not _floating(dtype):
            dtype = _default_float()
        elif dtype == jnp.bool_ and other.dtype != jnp.bool_:
            dtype = jnp.int64
    if to_float and not _floating(dtype):
        dtype = _default_float()
    return dtype


def _others(self, other) -> list:
    """`other` as one entry per tensor of `self`."""
    return list(other) if isinstance(other, (list, tuple)) else [other] * len(self)


def _map(fn, self, other=None, to_float=False):
    out = []
    for x, y in zip(self, _others(self, other)):
        dtype = _compute_dtype(x, y, to_float)
        out.append(fn(x.astype(dtype), None if y is None else jnp.asarray(y).astype(dtype)))
    return out


@lowers(aten._foreach_add.List, aten._foreach_add.Scalar, aten._foreach_add.ScalarList,
        aten._foreach_add.Tensor)
def foreach_add(self, other, *, alpha=1):
    return _map(lambda x, y: x + jnp.asarray(alpha).astype(x.dtype) * y, self, other)


@lowers(aten._foreach_sub.List, aten._foreach_sub.Scalar, aten._foreach_sub.ScalarList)
def foreach_sub(self, other, *, alpha=1):
    return _map(lambda x, y: x - jnp.asarray(alpha).astype(x.dtype) * y, self, other)


@lowers(aten._foreach_mul.List, aten._foreach_mul.Scalar, aten._foreach_mul.ScalarList,
        aten._foreach_mul.Tensor)
def foreach_mul(self, other):
    return _map(jnp.multiply, self, other)


@lowers(aten._foreach_div.List, aten._foreach_div.Scalar, aten._foreach_div.ScalarList,
        aten._foreach_div.Tensor)
def foreach_div(self, other):
    return _map(jnp.divide, self, other, to_float=True)


@lowers(aten._foreach_maximum.List, aten._foreach_maximum.Scalar, aten._foreach_maximum.ScalarList,
        aten._foreach_clamp_min.List, aten._foreach_clamp_min.Scalar, aten._foreach_clamp_min.ScalarList)
def foreach_maximum(self, other):
    return _map(jnp.maximum, self, other)


@lowers(aten._foreach_minimum.List, aten._foreach_minimum.Scalar, aten._foreach_minimum.ScalarList,
        aten._foreach_clamp_max.List, aten._foreach_clamp_max.Scalar, aten._foreach_clamp_max.ScalarList)
def foreach_minimum(self, other):
    return _map(jnp.minimum, self, other)


@lowers(aten._foreach_pow.List, aten._foreach_pow.Scalar, aten._foreach_pow.ScalarList)
def foreach_pow(self, exponent):
    return _map(jnp.power, self, exponent)


@lowers(aten._foreach_pow.ScalarAndTensor)
def foreach_scalar_pow(self, exponent):
    return _map(lambda e, s: jnp.power(s, e), exponent, self)


def _addc(combine, self, tensor1, tensor2, scalars):
    out = []
    for x, a, b, s in zip(self, tensor1, tensor2, _scalars(self, scalars)):
        dtype = jnp.promote_types(_compute_dtype(x, jnp.asarray(s)), jnp.promote_types(a.dtype, b.dtype))
        s = jnp.asarray(s).astype(dtype)
        # (value * t1) op t2, the order PyTorch's kernel evaluates
        out.append(x.astype(dtype) + combine(s * a.astype(dtype), b.astype(dtype)))
    return out


def _scalars(self, scalars) -> list:
    """addcmul/addcdiv's value: one Scalar, a Scalar list, or a 1-d tensor of one value per tensor."""
    if isinstance(scalars, (list, tuple)):
        return list(scalars)
    if jnp.ndim(scalars) == 1:
        return [scalars[i] for i in range(len(self))]
    return [scalars] * len(self)


@lowers(aten._foreach_addcmul.Scalar, aten._foreach_addcmul.ScalarList, aten._foreach_addcmul.Tensor)
def foreach_addcmul(self, tensor1, tensor2, scalars=1):
    return _addc(jnp.multiply, self, tensor1, tensor2, scalars)


@lowers(aten._foreach_addcdiv.Scalar, aten._foreach_addcdiv.ScalarList, aten._foreach_addcdiv.Tensor)
def foreach_addcdiv(self, tensor1, tensor2, scalars=1):
    return _addc(jnp.divide, self, tensor1, tensor2, scalars)


def _lerp(start, end, weight):
    # PyTorch's two-sided formula: exact at both weight=0 and weight=1.
    diff = end - start
    return jnp.where(jnp.abs(weight) < 0.5, start + weight * diff, end - diff * (1 - weight))


@lowers(aten._foreach_lerp.List, aten._foreach_lerp.Scalar, aten._foreach_lerp.ScalarList)
def foreach_lerp(self, tensors1, weight):
    out = []
    for x, end, w in zip(self, tensors1, _others(self, weight)):
        out.append(_lerp(x, end.astype(x.dtype), jnp.asarray(w).astype(x.dtype)))
    return out


def _unary(fn, to_float=False):
    def lowering(self):
        return _map(lambda x, _: fn(x), self, None, to_float)
    return lowering


lowers(aten._foreach_sqrt.default)(_unary(jnp.sqrt, to_float=True))
lowers(aten._foreach_exp.default)(_unary(jnp.exp, to_float=True))
lowers(aten._foreach_reciprocal.default)(_unary(jnp.reciprocal, to_float=True))
lowers(aten._foreach_neg.default)(_unary(jnp.negative))
lowers(aten._foreach_abs.default)(_unary(jnp.abs))
lowers(aten._foreach_sign.default)(_unary(jnp.sign))
lowers(aten._foreach_zero.default)(_unary(jnp.zeros_like))


@lowers(aten._foreach_copy.default)
def foreach_copy(self, src, non_blocking=False):
    return [jnp.broadcast_to(s, x.shape).astype(x.dtype) for x, s in zip(self, src)]


@lowers(aten._foreach_norm.Scalar, static_scalars=True)
def foreach_norm(self, ord=2, dtype=None):
    out = []
    for x in self:
        # Low-precision inputs accumulate in float32, as PyTorch's kernels do.
        compute = to_jax(dtype) if dtype is not None else jnp.promote_types(x.dtype, jnp.float32)
        out.append(jnp.linalg.norm(x.reshape(-1).astype(compute), ord=ord))
    return out
