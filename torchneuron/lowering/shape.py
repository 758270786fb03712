"""Lowerings: ops that copy values into a new shape (cat, pad, flip, roll, repeat, ...).

Views (view, transpose, split, unfold, ...) need no lowering: the fallback aliases them.
`x.to(dtype)`, `.double()`, `.contiguous()` and reshape of a non-contiguous tensor reach
`_to_copy` / `_reshape_copy`, whose composite kernels allocate and call `copy_`; `_to_copy`
stays unlowered because it also carries device moves, which are not a computation.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from ..runtime.layout import MOVED_AS_BYTES
from . import aten, lowers, sizes_from
from .padding import POSITION_WISE, Padding, pads, position_wise


def _promoted(tensors):
    """The tensors cast to their common dtype. Tensor-only promotion, where JAX (x64, no weak
    types) and PyTorch agree."""
    dtype = functools.reduce(jnp.promote_types, [t.dtype for t in tensors])
    return [t.astype(dtype) for t in tensors]


@lowers(aten.cat.default)
def cat(tensors, dim=0):
    tensors = _promoted(tensors)
    # PyTorch skips empty tensors, including legacy 1-D ones of any rank; the driver
    # broadcasts an all-empty result to the meta shape.
    kept = [t for t in tensors if t.size]
    if not kept:
        return jnp.zeros((), tensors[0].dtype)
    if kept[0].dtype in MOVED_AS_BYTES:  # (keeps float8 NaN payloads: runtime/layout.py)
        joined = jnp.concatenate([lax.bitcast_convert_type(t, jnp.uint8) for t in kept], axis=dim % kept[0].ndim)
        return lax.bitcast_convert_type(joined, kept[0].dtype)
    return jnp.concatenate(kept, axis=dim % kept[0].ndim)


@sizes_from(aten.cat.default)
def cat_sizes(tensors, dim=0) -> list | None:
    """cat's result shape from its inputs' (a decode step's caches and masks: PyTorch's meta kernel
    for cat is a Python reference, ~70-250 µs a call); None for anything unusual (legacy empty
    inputs, sizes that disagree), which the meta kernel decides."""
    first = tensors[0].shape
    rank = len(first)
    if not rank or not -rank <= dim < rank:
        return None
    dim %= rank
    total = 0
    for t in tensors:
        shape = t.shape
        if len(shape) != rank or shape[:dim] != first[:dim] or shape[dim + 1:] != first[dim + 1:]:
            return None
        total += shape[dim]
    return [(*first[:dim], total, *first[dim + 1:])]


@lowers(aten.stack.default)
def stack(tensors, dim=0):
    return jnp.stack(_promoted(tensors), axis=dim % (tensors[0].ndim + 1))


@lowers(aten.clone.default)
def clone(self, *, memory_format=None):
    # The layout memory_format asks for comes from the meta kernel; the values are the input's.
    return self


@lowers(aten.constant_pad_nd.default)
def constant_pad_nd(self, pad, value=0):
    # pad pairs run from the last dim backwards; negative amounts crop, which lax.pad allows.
    widths = [(0, 0, 0)] * self.ndim
    for i in range(len(pad) // 2):
        widths[self.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(self, jnp.asarray(value).astype(self.dtype), widths)


@lowers(aten.flip.default)
def flip(self, dims):
    axes = tuple({d % self.ndim for d in dims}) if self.ndim else ()
    return jnp.flip(self, axes) if axes else self


@lowers(aten.roll.default)
def roll(self, shifts, dims=()):
    if not dims:  # roll the flattened tensor
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    return jnp.roll(self, tuple(shifts), tuple(d % self.ndim for d in dims))


@lowers(aten.repeat.default)
def repeat(self, repeats):
    return jnp.tile(self, tuple(repeats))


@lowers(aten.tril.default)
def tril(self, diagonal=0):
    return jnp.tril(self, diagonal)


@lowers(aten.triu.default)
def triu(self, diagonal=0):
    return jnp.triu(self, diagonal)


@lowers(aten.diag_embed.default)
def diag_embed(self, offset=0, dim1=-2, dim2=-1):
    """The last dim of `self` as the `offset` diagonal of new dims (dim1, dim2)."""
    n = self.shape[-1]
    size = n + abs(offset)
    ndim = self.ndim + 1
    rows = jnp.arange(n) + max(-offset, 0)
    cols = jnp.arange(n) + max(offset, 0)
    out = jnp.zeros(self.shape[:-1] + (size, size), self.dtype).at[..., rows, cols].set(self)
    return jnp.moveaxis(out, (-2, -1), (dim1 % ndim, dim2 % ndim))


@lowers(aten.unfold_backward.default)
def unfold_backward(grad_in, input_sizes, dim, size, step):
    """The gradient of unfold: each window's gradient added back where the window was read."""
    from .views import unfold
    zeros = jnp.zeros(tuple(input_sizes), grad_in.dtype)
    _, pull = jax.vjp(lambda x: unfold(x, dim, size, step), zeros)
    return pull(grad_in)[0]


@lowers(aten.narrow_copy.default)
def narrow_copy(self, dim, start, length):
    start = start + self.shape[dim] if start < 0 else start
    return lax.slice_in_dim(self, start, start + length, axis=dim)


# ------------------------------------------------------------------ padding rules
# How each op stays exact on operands padded along a growing axis (padding.py).
pads(aten.clone.default, aten.tril.default, aten.triu.default)(position_wise)


def _legacy_empty(t) -> bool:
    """A 1-D tensor of size 0, which cat skips whatever the other operands' shapes."""
    return t.ndim == 1 and type(t.shape[0]) is int and t.shape[0] == 0


@pads(aten.cat.default)
def _cat_padding(call):
    # cat([torch.tensor([]), x]) is x (an empty cache grown by its first update): positions stay put
    if sum(not _legacy_empty(t) for t in call["tensors"]) == 1:
        return POSITION_WISE
    return Padding(exact=(("tensors", (call["dim"] % call["tensors"][0].ndim,)),))
