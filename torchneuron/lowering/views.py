"""Lowerings: view ops as values, for graphs (torch.compile), and writes into views.

In eager mode views are metadata over shared storage and never reach the table's kernels (the
eager registration skips view ops); in a functionalized graph a view is just a new value, and
these compute it. The scatter forms (slice_scatter, select_scatter, ...) write into a view as a
new value, in graphs and eager mode alike.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ..runtime.dtypes import to_jax
from ..runtime.layout import contiguous_stride
from . import aten
from . import lowers as _lowers
from .padding import POSITION_WISE, Padding, pads, position_wise


def lowers(*ops, **options):
    return _lowers(*ops, graph_only=True, **options)


@lowers(aten.alias.default, aten.detach.default, aten.lift_fresh.default)
def alias(self):
    return self


@lowers(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(self, size):
    return jnp.reshape(self, size)


@lowers(aten._reshape_alias.default)
def reshape_alias(self, size, stride):
    return jnp.reshape(self, size)


@lowers(aten.view.dtype)
def view_dtype(self, dtype):
    from ..runtime.storages import bitcast
    target = jnp.dtype(to_jax(dtype))
    flat = bitcast(self.reshape(-1), target)
    last = self.shape[-1] * self.dtype.itemsize // target.itemsize if self.ndim else 1
    return flat.reshape(self.shape[:-1] + (last,)) if self.ndim else flat.reshape(())


@lowers(aten.permute.default)
def permute(self, dims):
    return jnp.transpose(self, [d % max(self.ndim, 1) for d in dims])


@lowers(aten.t.default)
def t(self):
    return self.T


@lowers(aten.transpose.int)
def transpose(self, dim0, dim1):
    return jnp.swapaxes(self, dim0, dim1)


@lowers(aten.expand.default)
def expand(self, size, *, implicit=False):
    lead = len(size) - self.ndim
    shape = [self.shape[i - lead] if s == -1 else s for i, s in enumerate(size)]
    return jnp.broadcast_to(self, shape)


@lowers(aten.slice.Tensor)
def slice_(self, dim=0, start=None, end=None, step=1):
    n = self.shape[dim]
    start = 0 if start is None else (start + n if start < 0 else start)
    end = n if end is None else (end + n if end < 0 else end)
    start, end = min(max(start, 0), n), min(max(end, 0), n)
    end = max(end, start)
    return lax.slice_in_dim(self, start, end, step, axis=dim)


@lowers(aten.select.int)
def select(self, dim, index):
    return jnp.take(self, index % self.shape[dim], axis=dim)


@lowers(aten.unsqueeze.default)
def unsqueeze(self, dim):
    return jnp.expand_dims(self, dim % (self.ndim + 1))


@lowers(aten.squeeze.default)
def squeeze(self):
    return jnp.squeeze(self)


@lowers(aten.squeeze.dim)
def squeeze_dim(self, dim):
    return squeeze_dims(self, [dim])


@lowers(aten.squeeze.dims)
def squeeze_dims(self, dim):
    if self.ndim == 0:
        return self
    dims = tuple(d % self.ndim for d in dim if self.shape[d % self.ndim] == 1)
    return jnp.squeeze(self, dims) if dims else self


@lowers(aten.diagonal.default)
def diagonal(self, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(self, offset, dim1, dim2)


@lowers(aten.unfold.default)
def unfold(self, dimension, size, step):
    if self.ndim == 0:
        return self.reshape(1)
    dimension %= self.ndim  # the windows' count goes back where the dimension was, not at -1
    n = self.shape[dimension]
    count = (n - size) // step + 1
    starts = jnp.arange(count) * step
    windows = starts[:, None] + jnp.arange(size)[None, :]
    moved = jnp.moveaxis(self, dimension, -1)
    picked = moved[..., windows]  # [..., count, size]
    return jnp.moveaxis(picked, -2, dimension)


@lowers(aten.split.Tensor)
def split(self, split_size, dim=0):
    n = self.shape[dim]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] if n else [0]
    return split_with_sizes(self, sizes, dim)


@lowers(aten.split_with_sizes.default)
def split_with_sizes(self, split_sizes, dim=0):
    out, start = [], 0
    for size in split_sizes:
        out.append(lax.slice_in_dim(self, start, start + size, axis=dim))
        start += size
    return out


@lowers(aten.unbind.int)
def unbind(self, dim=0):
    return [jnp.take(self, i, axis=dim) for i in range(self.shape[dim])]


@lowers(aten.narrow.default)
def narrow(self, dim, start, length):
    start = start % self.shape[dim] if start < 0 else start
    return lax.slice_in_dim(self, start, start + length, axis=dim)


def _positions(shape, stride, offset):
    """The storage position of every element of a (shape, stride, offset) view."""
    idx = jnp.full(tuple(shape), offset, jnp.int64)
    for d, s in enumerate(stride):
        idx = idx + lax.broadcasted_iota(jnp.int64, tuple(shape), d) * s
    return idx


def _storage_of(value, layout, reach):
    """The storage a graph value is a view of, as far as the value covers it: its elements placed
    at their storage positions (`layout`: its strides and offset, as traced), `reach` positions at
    least. Positions no element covers hold zeros (the graph never reads them: as_strided views of
    a tensor stay within it)."""
    stride, offset = layout if layout is not None else (None, 0)
    if stride is None or tuple(stride) == contiguous_stride(value.shape):
        flat = value.reshape(-1)
        if offset == 0 and flat.shape[0] >= reach:
            return flat
        return jnp.zeros((max(reach, offset + flat.shape[0]),), value.dtype).at[offset:offset + flat.shape[0]].set(flat)
    places = _positions(value.shape, stride, offset).reshape(-1)
    extent = offset + sum((n - 1) * s for n, s in zip(value.shape, stride)) + 1 if value.size else 0
    return jnp.zeros((max(reach, extent),), value.dtype).at[places].set(value.reshape(-1))


def _reach(size, stride, offset):
    return offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1 if all(size) else 0


@lowers(aten.as_strided.default, strided=("self",))
def as_strided(self, size, stride, storage_offset=None, *, self_layout=None):
    """A view of the input's storage: the input's own strides and offset (as traced) say where
    each of its elements lies in that storage (x.t().as_strided(...) reads x's order)."""
    offset = storage_offset or 0
    storage = _storage_of(self, self_layout, _reach(size, stride, offset))
    return storage[_positions(size, stride, offset)]


@lowers(aten._conj.default)
def conj_view(self):
    # a graph's values carry no conj bit: the conjugate itself (complex rotary embeddings' backward)
    return jnp.conj(self)


@lowers(aten._neg_view.default)
def neg_view(self):
    return -self


@lowers(aten.view_as_real.default)
def view_as_real(self):
    return jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)


@lowers(aten.view_as_complex.default)
def view_as_complex(self):
    return lax.complex(self[..., 0], self[..., 1])


# ----------------------------------------------------------------------- writes into views
# Functionalized graphs write into a view of a tensor as `x_new = slice_scatter(x, src, ...)`: a copy
# of `x` whose viewed region holds `src`. These are ordinary ops (not graph-only): eager runs them too.
@_lowers(aten.slice_scatter.default)
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    # Python slices clamp and wrap start/end exactly as aten.slice does.
    index = (slice(None),) * (dim % self.ndim) + (slice(start, end, step),)
    return self.at[index].set(src.astype(self.dtype))


@_lowers(aten.select_scatter.default)
def select_scatter(self, src, dim, index):
    return self.at[(slice(None),) * (dim % self.ndim) + (index,)].set(src.astype(self.dtype))


@_lowers(aten.diagonal_scatter.default)
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    dims = (dim1 % self.ndim, dim2 % self.ndim)
    moved = jnp.moveaxis(self, dims, (-2, -1))
    n = src.shape[-1]  # the diagonal's length; aten.diagonal puts it last
    rows = jnp.arange(n) + max(-offset, 0)
    cols = jnp.arange(n) + max(offset, 0)
    moved = moved.at[..., rows, cols].set(src.astype(self.dtype))
    return jnp.moveaxis(moved, (-2, -1), dims)


@_lowers(aten.as_strided_scatter.default)
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    # As aten.as_strided in a graph: the storage is the value itself, laid out contiguously.
    idx = _positions(size, stride, storage_offset or 0)
    flat = self.reshape(-1).at[idx.reshape(-1)].set(src.astype(self.dtype).reshape(-1))
    return flat.reshape(self.shape)


# ------------------------------------------------------------------ padding rules
# How each op stays exact on operands padded along a growing axis (padding.py).
pads(aten.transpose.int, aten.t.default, aten.permute.default, aten.expand.default, aten.unsqueeze.default,
     aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.alias.default, aten.detach.default)(position_wise)


@pads(aten.split.Tensor, aten.split_with_sizes.default)
def _split_padding(call):
    return Padding(exact=(("self", (call["dim"] % call["self"].ndim,)),))


@pads(aten.select.int)
def _select_padding(call):
    return Padding(exact=(("self", (call["dim"] % call["self"].ndim,)),))


def _whole(call, size) -> bool:
    """The slice start:end:step takes every position of an axis of `size`: x[:], x[0:n] of n."""
    end = call["end"]
    if isinstance(end, torch.SymInt) and isinstance(size, torch.SymInt):
        # the same size (a bucketed graph runs both as the bucket), compared without a guard
        ends = end.node.expr == size.node.expr
    else:
        ends = end is None or (type(end) is int and (end >= 2**62 or type(size) is int and end >= size))
    return call["start"] in (None, 0) and ends and call["step"] == 1


@pads(aten.slice.Tensor)
def _slice_padding(call):
    if _whole(call, call["self"].shape[call["dim"] % call["self"].ndim]):  # every position stays put
        return POSITION_WISE
    return Padding(exact=(("self", (call["dim"] % call["self"].ndim,)),))


@pads(aten.slice_scatter.default)
def _slice_scatter_padding(call):
    # x[:, :] = src writes every position of src where it was; a partial slice along a padded axis
    # would move or drop positions (src's padding lands inside x's true region)
    dim = call["dim"] % call["self"].ndim
    if _whole(call, call["self"].shape[dim]):
        return POSITION_WISE
    return Padding(exact=(("self", (dim,)), ("src", (dim,))))
