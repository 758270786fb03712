"""Lowerings: elementwise arithmetic, comparison, logic and math functions."""
from __future__ import annotations

import jax.numpy as jnp

from . import ALWAYS_BOOL, DEFAULT, INT_TO_FLOAT, aten, lowers


@lowers(aten.add.Tensor, aten.add.Scalar, promote=DEFAULT)
def add(self, other, alpha=1):
    return self + other * alpha if not (isinstance(alpha, int) and alpha == 1) else self + other


@lowers(aten.sub.Tensor, aten.sub.Scalar, promote=DEFAULT)
def sub(self, other, alpha=1):
    return self - other * alpha if not (isinstance(alpha, int) and alpha == 1) else self - other


@lowers(aten.mul.Tensor, aten.mul.Scalar, promote=DEFAULT)
def mul(self, other):
    return self * other


@lowers(aten.div.Tensor, aten.div.Scalar, promote=INT_TO_FLOAT)
def div(self, other):
    return self / other


@lowers(aten.eq.Tensor, aten.eq.Scalar, promote=DEFAULT)
def eq(self, other):
    return self == other


@lowers(aten.lt.Tensor, aten.lt.Scalar, promote=DEFAULT)
def lt(self, other):
    return self < other


@lowers(aten.neg.default)
def neg(self):
    return -self


@lowers(aten.exp.default, promote=INT_TO_FLOAT, promote_args=("self",))
def exp(self):
    return jnp.exp(self)


@lowers(aten.copy.default)
def copy(self, src, non_blocking=False):
    return jnp.broadcast_to(src, self.shape).astype(self.dtype)


_ = ALWAYS_BOOL
