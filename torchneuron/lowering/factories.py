"""Lowerings: factories (fill, full, arange, linspace, logspace, eye, scalar_tensor).

In eager mode zeros/ones/full_like/new_* decompose above us into empty + fill_/zero_, whose
functional forms (fill, zero) are lowered here; empty and empty_like only allocate (storage work,
not the table's). Graphs reach allocations and full_like as values: those lowerings are graph-only.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from ..runtime.dtypes import to_jax
from . import aten, lowers
from .low_precision import cast
from .padding import pads, position_wise


@lowers(aten.fill.Scalar, aten.fill.Tensor)
def fill(self, value):
    return jnp.broadcast_to(cast(jnp.asarray(value), self.dtype), self.shape)


@lowers(aten.zero.default)
def zero(self):
    # (through cast: float8_e8m0fnu has no zero, and CPU stores 0 as 2**-127, byte 0)
    return fill(self, 0)


@lowers(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    # The driver casts to the meta dtype (fill_value's kind, or dtype); a given dtype here, as CPU
    # converts (float8 saturates)
    value = fill_value if dtype is None else cast(jnp.asarray(fill_value), to_jax(dtype))
    return jnp.broadcast_to(value, tuple(size))


@lowers(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return s


def _result_dtype(dtype, *values) -> torch.dtype:
    if dtype is not None:
        return dtype
    if all(isinstance(v, (bool, int)) for v in values):
        return torch.int64
    return torch.get_default_dtype()


# Uninitialised memory in a functional graph is never read before it is written: zeros will do.
@lowers(aten.empty.memory_format, graph_only=True)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(tuple(size), to_jax(dtype or torch.get_default_dtype()))


@lowers(aten.empty_strided.default, graph_only=True)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), to_jax(dtype or torch.get_default_dtype()))


@lowers(aten.empty_permuted.default, graph_only=True)
def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), to_jax(dtype or torch.get_default_dtype()))


@lowers(aten.new_empty_strided.default, graph_only=True)
def new_empty_strided(self, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), self.dtype if dtype is None else to_jax(dtype))


@lowers(aten.full_like.default, graph_only=True)
def full_like(self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    # The driver casts to the meta dtype (dtype, else self's).
    return jnp.broadcast_to(fill_value, self.shape)


@lowers(aten.arange.default, aten.arange.start, aten.arange.start_step, static_scalars=True)
def arange(*args, dtype=None, layout=None, device=None, pin_memory=None):
    start, end, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
    length = max(0, math.ceil((end - start) / step))
    if _result_dtype(dtype, start, end, step).is_floating_point:
        # PyTorch computes start + i * step in double, then rounds once to the result dtype.
        return start + step * jnp.arange(length, dtype=jnp.float64)
    # Integral results step in integers (the scalars truncate first, as in PyTorch's kernel).
    return int(start) + int(step) * jnp.arange(length, dtype=jnp.int64)


def _linspace_values(start, end, steps: int, result: torch.dtype, compute):
    """PyTorch's symmetric formula: the first half steps up from start, the second down from end,
    so that both ends are exact. Integral results take integral ends (PyTorch truncates them)."""
    start, end = jnp.asarray(start), jnp.asarray(end)
    if not (result.is_floating_point or result.is_complex):
        start, end = start.astype(jnp.int64), end.astype(jnp.int64)
    start, end = start.astype(compute), end.astype(compute)
    if steps == 1:
        return jnp.reshape(start, (1,))
    # a true division: XLA would multiply by the rounded reciprocal of a constant divisor
    step = (end - start) / lax.optimization_barrier(jnp.asarray(steps - 1, compute))
    i = jnp.arange(steps)
    return jnp.where(i < steps // 2, start + step * i.astype(compute), end - step * (steps - 1 - i).astype(compute))


@lowers(aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar,
        aten.linspace.Scalar_Tensor)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    result = dtype if dtype is not None else torch.get_default_dtype()
    # Integral results are computed in double and truncated, floating ones in their own dtype.
    compute = to_jax(result) if result.is_floating_point or result.is_complex else jnp.float64
    return _linspace_values(start, end, steps, result, compute)


@lowers(aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar,
        aten.logspace.Scalar_Tensor)
def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    result = dtype if dtype is not None else torch.get_default_dtype()
    return jnp.power(base, _linspace_values(start, end, steps, result, jnp.float64))


@lowers(aten.eye.default, aten.eye.m)
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, n if m is None else m, dtype=jnp.bool_)


@lowers(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.stack(jnp.triu_indices(row, offset, col)).astype(jnp.int64)


@lowers(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.stack(jnp.tril_indices(row, offset, col)).astype(jnp.int64)


@lowers(aten._efficientzerotensor.default)
def efficient_zero_tensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    # PyTorch's ZeroTensor is a storage-free zero; here it is an ordinary zero tensor.
    return jnp.zeros(tuple(size), jnp.float32)


# ------------------------------------------------------------------ padding rules
# How each op stays exact on operands padded along a growing axis (padding.py).
pads(aten.full.default, aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
     aten.scalar_tensor.default, aten.fill.Scalar, aten.fill.Tensor, aten.zero.default,
     # uninitialised memory: the table allocates zeros, whose value at a position ignores the size
     aten.empty.memory_format, aten.empty_strided.default, aten.empty_permuted.default,
     aten.new_empty_strided.default,
     # arange(B)[:s] == arange(s)
     aten.arange.default, aten.arange.start)(position_wise)
