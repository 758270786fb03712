"""Lowerings: indexing, gathers and scatters.

Negative indices wrap where PyTorch allows them (JAX's indexing normalises them). Out-of-range
indices cannot raise inside a compiled computation: each op checks them as a device-side assert
(lowering/asserts.py), reported at the next synchronisation; the computation itself clamps
gathers and drops scatters.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from ..runtime.dtypes import scalar_type_name, to_torch
from . import argument_rule, aten, lowers, overrides_meta, takes_host_operands
from .asserts import check_index, device_assert


def _is_mask(index) -> bool:
    return index.dtype in (jnp.bool_, jnp.uint8)


def _key(indices) -> tuple:
    """PyTorch's Tensor?[] indices as a JAX index: None is a full slice, a mask its True coordinates.
    Masks need concrete values here: such calls run outside jit (their meta kernel cannot size them)."""
    key = []
    for index in indices:
        if index is None:
            key.append(slice(None))
        elif _is_mask(index):
            key.extend(jnp.nonzero(index))
        else:
            key.append(index)
    return tuple(key)


def _check_advanced(self, indices) -> None:
    """Each integer index within the size of the dimension it indexes (masks are sized by meta)."""
    dim = 0
    for index in indices:
        if index is not None and not _is_mask(index):
            check_index(index, self.shape[dim], f"index along dimension {dim}", negative=True)
        dim += 1 if index is None or not _is_mask(index) else index.ndim


# Advanced indexing's indices and masks may be CPU tensors, as on CUDA (ATen's make_info moves
# them; `index` checks they are on CPU or on self's device): the driver moves them first. Other ops,
# index_fill_/index_select/gather/scatter included, refuse CPU tensors on CUDA with the same-device
# error, and so does neuron.
takes_host_operands(("indices",), aten.index.Tensor, aten.index.Tensor_out, aten._unsafe_index.Tensor,
                    aten.index_put.default, aten.index_put.out, aten.index_put_.default,
                    aten._index_put_impl.default, aten._index_put_impl.out, aten._index_put_impl_.default,
                    aten._unsafe_index_put.default)


@lowers(aten.index.Tensor, checks=True)
def index(self, indices):
    _check_advanced(self, indices)
    key = _key(indices)
    # with a mask, CPU's broadcast check of the indices is on its True coordinates (the refusals
    # check the rest, from shapes)
    shapes = [k.shape for k in key if not isinstance(k, slice)]
    try:
        jnp.broadcast_shapes(*shapes)
    except ValueError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                         + ", ".join(str(list(shape)) for shape in shapes)) from None
    return self[key]


@lowers(aten._unsafe_index.Tensor)
def unsafe_index(self, indices):
    return self[_key(indices)]  # its callers' indices are in range: no check


def _advanced_axis(self, indices) -> tuple[int, int]:
    """(position of the advanced-index dims in x[indices], rank of x[indices]) when every
    advanced index is, or broadcasts to, one dimension (the case with masks)."""
    used = [i for i, index in enumerate(indices) if index is not None]
    consumed = sum(index.ndim if _is_mask(index) else 1 for index in indices if index is not None)
    rank = self.ndim - consumed + 1
    adjacent = used == list(range(used[0], used[-1] + 1))
    position = sum(1 if index is None else 0 for index in indices[:used[0]]) if adjacent else 0
    return position, rank


def _put_key(self, indices, values) -> tuple:
    """The JAX index of an index_put. A mask (traced) becomes its True coordinates padded to a
    static length: the number of values along the indexed dim when values has one, else the
    mask's size, padded with an out-of-range index that the scatter drops."""
    if not any(index is not None and _is_mask(index) for index in indices):
        return tuple(slice(None) if index is None else index for index in indices)
    position, rank = _advanced_axis(self, indices)
    axis = position - (rank - values.ndim)
    count = values.shape[axis] if 0 <= axis < values.ndim and values.shape[axis] != 1 else None
    advanced = [index for index in indices if index is not None]
    if count is not None and len(advanced) == 1:  # CPU's value shape check, on the mask's True count
        device_assert(jnp.sum(advanced[0]) == count, f"shape mismatch: value tensor of shape {list(values.shape)} "
                                                     "cannot be broadcast to indexing result (the mask's True count)")
    key, dim = [], 0
    for index in indices:
        if index is None:
            key.append(slice(None))
            dim += 1
        elif _is_mask(index):
            size = count if count is not None else index.size
            coords = jnp.nonzero(index, size=size, fill_value=self.shape[dim])
            key.extend(coords)
            dim += index.ndim
        else:
            key.append(index)
            dim += 1
    return tuple(key)


# XLA scatters have no add or multiply for bool; PyTorch's bool sum and product are or and and.
_BOOL_SCATTER = {"add": "max", "multiply": "min"}


def _scatter_into(at, method: str, values, dtype):
    """`x.at[key].<method>(values)`, out-of-range indices dropped, with bool's add and multiply."""
    if dtype == jnp.bool_:
        method = _BOOL_SCATTER.get(method, method)
    return getattr(at, method)(values, mode="drop")


@lowers(aten.index_put.default, aten._index_put_impl.default, checks=True)
def index_put(self, indices, values, accumulate=False, unsafe=False):
    _check_advanced(self, indices)
    return unsafe_index_put(self, indices, values, accumulate)


@lowers(aten._unsafe_index_put.default)
def unsafe_index_put(self, indices, values, accumulate=False):
    at = self.at[_put_key(self, indices, values)]
    return _scatter_into(at, "add" if accumulate else "set", values.astype(self.dtype), self.dtype)


def _dim_key(ndim: int, dim: int, index) -> tuple:
    return (slice(None),) * (dim % ndim) + (index,)


def _as_1d(x):
    """index_* ops accept 0-d tensors, as if they were 1-d."""
    return x.reshape(1) if x.ndim == 0 else x


@lowers(aten.index_select.default, checks=True)
def index_select(self, dim, index):
    check_index(index, _size(self, dim))
    out = jnp.take(_as_1d(self), _as_1d(index), axis=dim, mode="clip")
    return out.reshape(()) if self.ndim == 0 else out


@lowers(aten.index_add.default, checks=True)
def index_add(self, dim, index, source, *, alpha=1):
    check_index(index, _size(self, dim))
    x = _as_1d(self)
    source = _as_1d(source).astype(self.dtype) * jnp.asarray(alpha).astype(self.dtype)
    return _scatter_into(x.at[_dim_key(x.ndim, dim, _as_1d(index))], "add", source, x.dtype).reshape(self.shape)


@argument_rule(aten.index_add.default, aten.index_add_.default, aten.index_add.out)
def _index_add_dtypes(self, dim, index, source, *, alpha=1, out=None):
    if self.dtype != source.dtype:
        raise RuntimeError(f"index_add_(): self ({scalar_type_name(self.dtype)}) and source "
                           f"({scalar_type_name(source.dtype)}) must have the same scalar type")


@lowers(aten.index_copy.default, checks=True)
def index_copy(self, dim, index, source):
    check_index(index, _size(self, dim))
    x = _as_1d(self)
    source = _as_1d(source).astype(self.dtype)
    return x.at[_dim_key(x.ndim, dim, _as_1d(index))].set(source, mode="drop").reshape(self.shape)


@argument_rule(aten.index_copy.default, aten.index_copy_.default, aten.index_copy.out)
def _index_copy_dtypes(self, dim, index, source, *, out=None):
    if self.dtype != source.dtype:  # (CPU's check; PyTorch's meta kernel casts)
        raise RuntimeError(f"index_copy_(): self and source expected to have the same dtype, but got (self) "
                           f"{scalar_type_name(self.dtype)} and (source) {scalar_type_name(source.dtype)}")


@lowers(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, checks=True)
def index_fill(self, dim, index, value):
    check_index(index, _size(self, dim), negative=True)
    x = _as_1d(self)
    value = jnp.asarray(value).astype(self.dtype)
    return x.at[_dim_key(x.ndim, dim, _as_1d(index))].set(value, mode="drop").reshape(self.shape)


def _size(self, dim: int) -> int:
    """The size of `self` along `dim`; a 0-d tensor counts as one element."""
    return self.shape[dim] if self.ndim else 1


def _coords(index, dim: int) -> tuple:
    """Full coordinates of a gather/scatter: `index` along dim, each element's position elsewhere."""
    dim = dim % max(index.ndim, 1)
    grids = jnp.indices(index.shape, sparse=True)
    return tuple(index if d == dim else grids[d] for d in range(index.ndim))


@lowers(aten.gather.default, checks=True)
def gather(self, dim, index, *, sparse_grad=False):
    if index.size == 0:  # PyTorch accepts an empty index of any rank
        return jnp.zeros(index.shape, self.dtype)
    check_index(index, _size(self, dim))
    if self.ndim == 0:
        return jnp.broadcast_to(self, index.shape)
    return self[_coords(index, dim)]


def _shaped_like(src, index):
    """The part of src that index covers (scatter's src may be larger than index)."""
    if jnp.ndim(src) == 0:
        return src
    return src[tuple(slice(0, n) for n in index.shape)]


_SCATTER = {"add": "add", "sum": "add", "multiply": "multiply", "prod": "multiply", "amax": "max",
            "amin": "min", None: "set"}


def _scatter(self, dim, index, src, reduce):
    check_index(index, _size(self, dim))
    if self.ndim == 0:  # a 0-d tensor scatters as a 1-element vector
        return _scatter(self.reshape(1), 0, index.reshape(-1), jnp.reshape(src, -1), reduce).reshape(())
    src = _shaped_like(jnp.asarray(src).astype(self.dtype), index)
    return _scatter_into(self.at[_coords(index, dim)], _SCATTER[reduce], src, self.dtype)


@lowers(aten.scatter.src, aten.scatter.value, checks=True)
def scatter(self, dim, index, src):
    return _scatter(self, dim, index, src, None)


@lowers(aten.scatter.reduce, aten.scatter.value_reduce, checks=True)
def scatter_reduce_legacy(self, dim, index, src, *, reduce):
    return _scatter(self, dim, index, src, reduce)


@lowers(aten.scatter_add.default, checks=True)
def scatter_add(self, dim, index, src):
    return _scatter(self, dim, index, src, "add")


def _identity(reduce: str, dtype):
    if reduce in ("sum", "mean"):
        return jnp.zeros((), dtype)
    if reduce == "prod":
        return jnp.ones((), dtype)
    if dtype == jnp.bool_:
        return jnp.asarray(reduce == "amin")
    info = jnp.finfo(dtype) if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype)
    low, high = (-jnp.inf, jnp.inf) if jnp.issubdtype(dtype, jnp.floating) else (info.min, info.max)
    return jnp.asarray(low if reduce == "amax" else high, dtype)


@lowers(aten.scatter_reduce.two, checks=True)
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    base = self if include_self else _scatter(self, dim, index, _identity(reduce, self.dtype), None)
    out = _scatter(base, dim, index, src, "sum" if reduce == "mean" else reduce)
    if reduce != "mean":
        return out
    ones = jnp.ones(index.shape, self.dtype)
    count = _scatter(jnp.full(self.shape, 1 if include_self else 0, self.dtype), dim, index, ones, "sum")
    count = jnp.maximum(count, 1)  # untouched positions keep their value
    if jnp.issubdtype(self.dtype, jnp.floating):
        return out / count
    return jnp.floor_divide(out, count)


@lowers(aten.masked_scatter.default)
def masked_scatter(self, mask, source):
    mask = jnp.broadcast_to(mask, jnp.broadcast_shapes(self.shape, mask.shape))
    flat = mask.reshape(-1)
    # The k-th True element takes source's k-th element (in row-major order).
    position = jnp.clip(jnp.cumsum(flat) - 1, 0, max(source.size - 1, 0))
    taken = source.reshape(-1)[position].reshape(mask.shape) if source.size else jnp.zeros(mask.shape)
    return jnp.where(mask, taken.astype(self.dtype), self)


@lowers(aten.masked_scatter_backward.default)
def masked_scatter_backward(grad_output, mask, sizes):
    """source's gradient: the k-th True element's gradient goes to source position k, the rest 0.
    The result's shape is `sizes`, not data-dependent: compiled graphs lower it (Gemma 3's image
    tokens are placed with masked_scatter)."""
    flat = jnp.broadcast_to(mask, grad_output.shape).reshape(-1)
    total = math.prod(sizes)
    position = jnp.where(flat, jnp.cumsum(flat) - 1, total)  # total: out of range, dropped
    grad = jnp.zeros(total, grad_output.dtype).at[position].set(grad_output.reshape(-1), mode="drop")
    return grad.reshape(sizes)


@lowers(aten.take.default, checks=True)
def take(self, index):
    check_index(index, self.size, negative=True)
    return self.reshape(-1)[index]


@lowers(aten.put.default, checks=True)
def put(self, index, source, accumulate=False):
    check_index(index, self.size, negative=True)
    at = self.reshape(-1).at[index.reshape(-1)]
    source = source.reshape(-1).astype(self.dtype)
    return _scatter_into(at, "add" if accumulate else "set", source, self.dtype).reshape(self.shape)


@overrides_meta(aten.nonzero.out)
def _nonzero_out(self, *, out):
    # a data-dependent op: only its arguments are checked (CPU's message lacks the space)
    if out.dtype != torch.long:
        raise RuntimeError(f"nonzero: Expected out tensor to have scalar type Long but got scalar "
                           f"type{scalar_type_name(out.dtype)}")


@lowers(aten.nonzero.default, data_dependent=True)
def nonzero(self):
    if self.ndim == 0:
        return jnp.zeros((int(self.astype(bool)), 0), jnp.int64)
    return jnp.stack(jnp.nonzero(self), axis=1).astype(jnp.int64)


@lowers(aten.repeat_interleave.Tensor, data_dependent=True)
def repeat_interleave(repeats, *, output_size=None):
    """Index i repeated repeats[i] times (x.repeat_interleave(r) indexes x with it): as many as the
    repeats add up to, a data-dependent size unless output_size gives it. CPU's checks and words."""
    if repeats.ndim != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if not jnp.issubdtype(repeats.dtype, jnp.integer):
        raise NotImplementedError(f'"repeat_interleave_cpu" not implemented for '
                                  f"'{scalar_type_name(to_torch(repeats.dtype))}'")
    if bool((repeats < 0).any()):
        raise RuntimeError("repeats can not be negative")
    total = int(repeats.sum())
    if output_size is not None and output_size != total:
        raise RuntimeError("allocated size does not match required size")
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=repeats.dtype), repeats, total_repeat_length=total)


@lowers(aten.masked_select.default, data_dependent=True)
def masked_select(self, mask):
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    return jnp.broadcast_to(self, shape)[jnp.broadcast_to(mask, shape)]


@lowers(aten.index_reduce.default)
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    """index_add's reducing cousin: prod, mean, amax or amin of the source slices sent to each index."""
    x = _as_1d(self)
    key = _dim_key(x.ndim, dim, _as_1d(index))
    source = _as_1d(source).astype(self.dtype)
    base = x if include_self else x.at[key].set(_identity(reduce, x.dtype), mode="drop")
    op = {"prod": "multiply", "mean": "add", "amax": "max", "amin": "min"}[reduce]
    out = _scatter_into(base.at[key], op, source, x.dtype)
    if reduce == "mean":
        count = jnp.full(x.shape, 1 if include_self else 0, x.dtype).at[key].add(
            jnp.ones(source.shape, x.dtype), mode="drop")
        count = jnp.maximum(count, 1)  # untouched positions keep their value
        out = out / count if jnp.issubdtype(x.dtype, jnp.floating) else jnp.floor_divide(out, count)
    return out.reshape(self.shape)


# unique: how many values come back depends on the data, so these run outside jit
# (data_dependent). CPU sorts even with sorted=False; so do we. Outputs not asked for are empty.
def _empty_index():
    return jnp.zeros((0,), jnp.int64)


@lowers(aten._unique2.default, data_dependent=True)
def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    values, inverse, counts = jnp.unique(self.reshape(-1), return_inverse=True, return_counts=True)
    return (values, inverse.reshape(self.shape).astype(jnp.int64) if return_inverse else _empty_index(),
            counts.astype(jnp.int64) if return_counts else _empty_index())


@lowers(aten._unique.default, data_dependent=True)
def unique(self, sorted=True, return_inverse=False):
    return unique2(self, sorted, return_inverse, False)[:2]


@lowers(aten.unique_consecutive.default, data_dependent=True)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    if dim is not None and self.ndim != 1:
        return _unique_consecutive_dim(self, dim)
    flat = self.reshape(-1)
    starts = jnp.concatenate([jnp.ones((min(flat.shape[0], 1),), bool), flat[1:] != flat[:-1]])
    group = jnp.cumsum(starts) - 1
    values = flat[starts]
    counts = jnp.bincount(group, length=values.shape[0]) if flat.shape[0] else _empty_index()
    return (values, group.reshape(self.shape).astype(jnp.int64) if return_inverse else _empty_index(),
            counts.astype(jnp.int64) if return_counts else _empty_index())


def _unique_consecutive_dim(self, dim):
    """CPU's unique_consecutive along `dim`: each run of equal slices becomes one; the inverse and
    the counts come back whether asked for or not, as on CPU."""
    if self.ndim == 0:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    if not -self.ndim <= dim < self.ndim:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-self.ndim}, {self.ndim - 1}], "
                         f"but got {dim})")
    dim %= self.ndim
    if self.shape[dim] == 0:
        if self.shape.count(0) > 1:
            raise RuntimeError("Number of zero sized dimensions is more than one, so unique cannot be applied ")
        return self, _empty_index(), _empty_index()
    if self.size == 0:
        raise RuntimeError("There are 0 sized dimensions, and they aren't selected, so unique cannot be applied")
    slices = jnp.moveaxis(self, dim, 0)
    rows = slices.reshape(slices.shape[0], -1)
    starts = jnp.concatenate([jnp.ones((1,), bool), jnp.any(rows[1:] != rows[:-1], axis=1)])
    group = jnp.cumsum(starts) - 1
    counts = jnp.bincount(group, length=int(group[-1]) + 1)
    return jnp.moveaxis(slices[starts], 0, dim), group.astype(jnp.int64), counts.astype(jnp.int64)


@lowers(aten.nonzero_static.default)
def nonzero_static(self, *, size, fill_value=-1):
    """nonzero with a fixed number of rows: padded with fill_value or cut, so it needs no data."""
    if self.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    return jnp.stack(jnp.nonzero(self, size=size, fill_value=fill_value), axis=-1).astype(jnp.int64)
