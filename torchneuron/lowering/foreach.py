"""Lowerings: _foreach_* ops (what torch.optim runs with foreach=True).

Each op maps an elementwise function over its tensor list. `other` is a matching list, one
Scalar, a Scalar list, or one tensor. Scalars arrive as float64/int64 0-d arrays: they are
cast to each tensor's computation dtype, so a float32 list computes in float32 as on CPU.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch

from ..runtime.dtypes import to_jax
from . import aten, lowers, runs_as


def _floating(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating)


def _default_float():
    return to_jax(torch.get_default_dtype())


def _compute_dtype(x, other, to_float=False, tensor=False):
    """PyTorch's promotion of tensor x with `other`: a tensor promotes fully; a Scalar (or the
    single 0-d tensor of a .Tensor overload) only lifts x to its category (int -> float)."""
    dtype = x.dtype
    if other is not None:
        if tensor:
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


def _map(fn, self, other=None, to_float=False, tensors=False):
    out = []
    for x, y in zip(self, _others(self, other)):
        dtype = _compute_dtype(x, None if y is None else jnp.asarray(y), to_float, tensors)
        out.append(fn(x.astype(dtype), None if y is None else jnp.asarray(y).astype(dtype)))
    return out


def _binary(list_op, scalar_ops, fn, to_float=False) -> None:
    """Lower a binary foreach op: its List overload `list_op` (full promotion) and its Scalar,
    ScalarList and Tensor overloads `scalar_ops` (scalar promotion). fn(x, y, alpha) computes one
    element."""

    @lowers(list_op)
    def of_lists(self, other, *, alpha=1):
        return _map(lambda x, y: fn(x, y, alpha), self, other, to_float, tensors=True)

    @lowers(*scalar_ops)
    def of_scalars(self, other, *, alpha=1):
        return _map(lambda x, y: fn(x, y, alpha), self, other, to_float)


def _scaled(alpha, x):
    return jnp.asarray(alpha).astype(x.dtype) * x


_binary(aten._foreach_add.List,
        (aten._foreach_add.Scalar, aten._foreach_add.ScalarList, aten._foreach_add.Tensor),
        lambda x, y, alpha: x + _scaled(alpha, y))
_binary(aten._foreach_sub.List, (aten._foreach_sub.Scalar, aten._foreach_sub.ScalarList),
        lambda x, y, alpha: x - _scaled(alpha, y))
_binary(aten._foreach_mul.List,
        (aten._foreach_mul.Scalar, aten._foreach_mul.ScalarList, aten._foreach_mul.Tensor),
        lambda x, y, alpha: x * y)
_binary(aten._foreach_div.List,
        (aten._foreach_div.Scalar, aten._foreach_div.ScalarList, aten._foreach_div.Tensor),
        lambda x, y, alpha: x / y, to_float=True)
_binary(aten._foreach_maximum.List, (aten._foreach_maximum.Scalar, aten._foreach_maximum.ScalarList),
        lambda x, y, alpha: jnp.maximum(x, y))
_binary(aten._foreach_clamp_min.List, (aten._foreach_clamp_min.Scalar, aten._foreach_clamp_min.ScalarList),
        lambda x, y, alpha: jnp.maximum(x, y))
_binary(aten._foreach_minimum.List, (aten._foreach_minimum.Scalar, aten._foreach_minimum.ScalarList),
        lambda x, y, alpha: jnp.minimum(x, y))
_binary(aten._foreach_clamp_max.List, (aten._foreach_clamp_max.Scalar, aten._foreach_clamp_max.ScalarList),
        lambda x, y, alpha: jnp.minimum(x, y))
_binary(aten._foreach_pow.List, (aten._foreach_pow.Scalar, aten._foreach_pow.ScalarList),
        lambda x, y, alpha: jnp.power(x, y))


@lowers(aten._foreach_pow.ScalarAndTensor)
def foreach_scalar_pow(self, exponent):
    return _map(lambda e, s: jnp.power(s, e), exponent, self)


def _addc(combine, self, tensor1, tensor2, scalars):
    out = []
    for x, a, b, s in zip(self, tensor1, tensor2, _others(self, scalars)):
        dtype = jnp.promote_types(_compute_dtype(x, jnp.asarray(s)), jnp.promote_types(a.dtype, b.dtype))
        s = jnp.asarray(s).astype(dtype)
        # (value * t1) op t2, the order PyTorch's kernel evaluates
        out.append(x.astype(dtype) + combine(s * a.astype(dtype), b.astype(dtype)))
    return out


# The .Tensor overloads take their per-list values in a 1-D CPU tensor: they run as the ScalarList
# overloads (PyTorch's own kernels read that tensor on the host too).
@lowers(aten._foreach_addcmul.Scalar, aten._foreach_addcmul.ScalarList)
def foreach_addcmul(self, tensor1, tensor2, scalars=1):
    return _addc(jnp.multiply, self, tensor1, tensor2, scalars)


@lowers(aten._foreach_addcdiv.Scalar, aten._foreach_addcdiv.ScalarList)
def foreach_addcdiv(self, tensor1, tensor2, scalars=1):
    return _addc(jnp.divide, self, tensor1, tensor2, scalars)


for _name in ("_foreach_addcmul", "_foreach_addcmul_", "_foreach_addcdiv", "_foreach_addcdiv_"):
    runs_as(getattr(aten, _name).ScalarList, getattr(aten, _name).Tensor)


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
