"""Lowerings: matrix products.

float32/float64 products run at full precision (JAX's default matmul precision here is
"highest"); float16/bfloat16 products accumulate in float32 and round once, as PyTorch's CPU
kernels do.
"""
from __future__ import annotations

import jax.numpy as jnp

from . import aten, lowers

_LOW = (jnp.float16, jnp.bfloat16)


def _acc_dtype(dtype):
    return jnp.float32 if dtype in _LOW else None


def matmul(a, b, out_dtype=None):
    """a @ b, accumulated in float32 for half types, returned in out_dtype (default a's dtype)."""
    out_dtype = out_dtype or a.dtype
    acc = _acc_dtype(a.dtype)
    return jnp.matmul(a, b, preferred_element_type=acc).astype(out_dtype)


def _scaled_sum(self, product, beta, alpha):
    """beta * self + alpha * product; beta == 0 ignores self entirely (NaN/inf included)."""
    dtype = product.dtype
    acc = _acc_dtype(dtype) or dtype
    scaled = product.astype(acc) * jnp.asarray(alpha).astype(acc)
    base = jnp.where(beta == 0, jnp.zeros((), acc), self.astype(acc) * jnp.asarray(beta).astype(acc))
    return (base + scaled).astype(dtype)


def _keep_acc(a, b):
    """The product in the accumulation dtype (for addmm-like ops that round once at the end)."""
    acc = _acc_dtype(a.dtype)
    return jnp.matmul(a, b, preferred_element_type=acc)


@lowers(aten.mm.default, aten.bmm.default, aten.dot.default)
def mm(self, mat2_or_tensor):
    return matmul(self, mat2_or_tensor)


@lowers(aten.mm.dtype, aten.bmm.dtype)
def mm_dtype(self, mat2, out_dtype):
    return jnp.matmul(self, mat2, preferred_element_type=jnp.float32).astype(out_dtype)


@lowers(aten.mv.default)
def mv(self, vec):
    return matmul(self, vec)


@lowers(aten.vdot.default)
def vdot(self, other):
    return matmul(jnp.conj(self), other)


@lowers(aten.addmm.default, aten.addmv.default, aten.baddbmm.default)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    return _scaled_sum(self, _keep_acc(mat1, mat2), beta, alpha).astype(mat1.dtype)


@lowers(aten.addmm.dtype, aten.baddbmm.dtype)
def addmm_dtype(self, mat1, mat2, out_dtype, *, beta=1, alpha=1):
    product = jnp.matmul(mat1, mat2, preferred_element_type=jnp.float32)
    return _scaled_sum(self.astype(jnp.float32), product, beta, alpha).astype(out_dtype)


@lowers(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    return _scaled_sum(self, jnp.sum(_keep_acc(batch1, batch2), axis=0), beta, alpha).astype(batch1.dtype)


@lowers(aten.addr.default)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    outer = vec1[:, None] * vec2[None, :]
    if outer.dtype == jnp.bool_:  # bool addr is (beta and self) or (alpha and outer)
        return jnp.logical_or(jnp.logical_and(beta != 0, self), jnp.logical_and(alpha != 0, outer))
    return _scaled_sum(self, outer, beta, alpha)
