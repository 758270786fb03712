"""Reading and writing strided tensors in flat buffers, inside jit-compiled code.

A layout is (shape, stride, offset) in elements; the offset is a Python int or a traced integer
(one executable for a view at any offset). Reads are a reshape when the tensor covers
its buffer, a slice when it is a contiguous block, a slice and transpose when it is a dense
permutation, and otherwise a gather over offset + sum(index_i * stride_i). Writes mirror this
with dynamic_update_slice or a scatter into the (donated) buffer.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
from jax import lax


class Layout(NamedTuple):
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def dense_order(self) -> tuple[int, ...] | None:
        """Dims from outermost to innermost if the tensor is a dense block (possibly
        permuted), else None (also for traced strides: only a gapped view's are traced)."""
        if not all(type(s) is int for s in self.stride):
            return None
        dims = sorted((d for d in range(len(self.shape)) if self.shape[d] != 1),
                      key=lambda d: -self.stride[d])
        expected = 1
        for d in reversed(dims):
            if self.stride[d] != expected:
                return None
            expected *= self.shape[d]
        ones = [d for d in range(len(self.shape)) if self.shape[d] == 1]
        return tuple(dims + ones)

    def is_contiguous(self) -> bool:
        order = self.dense_order()
        return order is not None and [d for d in order if self.shape[d] != 1] == sorted(
            d for d in order if self.shape[d] != 1)

    def indices(self):
        """Flat buffer index of every element, as an int array of `shape`."""
        idx = jnp.full(self.shape, self.offset, jnp.int64)
        for d, (n, s) in enumerate(zip(self.shape, self.stride)):
            if n > 1 and (type(s) is not int or s != 0):
                idx = idx + lax.broadcasted_iota(jnp.int64, self.shape, d) * s
        return idx


def canonical_stride(shape, stride) -> tuple:
    """`stride` with size-1 dimensions' strides as 0: no element address depends on them, so layouts
    that differ only there (a contiguous (1, h, 1, d) and a transposed view of one) share a plan."""
    return tuple(0 if n == 1 else s for n, s in zip(shape, stride))


def contiguous_stride(shape) -> tuple[int, ...]:
    stride, acc = [], 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(stride))


# XLA:CPU slices, updates, pads and concatenates float8 arrays through float16, which turns a NaN
# with another payload (float8_e5m2 has three of each sign) into the canonical one and rounds
# float8_e5m2fnuz's smallest normals (float16 subnormals) up: reads and writes move their bytes.
MOVED_AS_BYTES = frozenset(jnp.dtype(d) for d in (jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float8_e4m3fnuz,
                                                  jnp.float8_e5m2fnuz, jnp.float8_e8m0fnu))


def read(buffer, layout: Layout):
    if buffer.dtype in MOVED_AS_BYTES:
        return lax.bitcast_convert_type(read(lax.bitcast_convert_type(buffer, jnp.uint8), layout), buffer.dtype)
    n = layout.numel
    if n == 0:
        return jnp.zeros(layout.shape, buffer.dtype)
    order = layout.dense_order()
    if order is None:
        return buffer[layout.indices()]
    if isinstance(layout.offset, int):
        block = buffer if (layout.offset == 0 and buffer.shape[0] == n) else lax.slice(
            buffer, (layout.offset,), (layout.offset + n,))
    else:
        block = lax.dynamic_slice(buffer, (layout.offset,), (n,))
    permuted = block.reshape([layout.shape[d] for d in order])
    if list(order) == sorted(order):
        return permuted
    return jnp.transpose(permuted, [order.index(d) for d in range(len(order))])


def flatten(value, layout: Layout):
    """`value` laid out as the dense block `layout` describes (layout must be dense)."""
    if layout.numel == 0:  # any strides describe an empty block (topk(k=0) gives (1, 1) for (4, 0))
        return value.reshape(-1)
    order = layout.dense_order()
    if list(order) != sorted(order):
        value = jnp.transpose(value, order)
    return value.reshape(-1)


def write(buffer, layout: Layout, value):
    """`buffer` with the elements that `layout` addresses replaced by `value`."""
    value = jnp.broadcast_to(value.astype(buffer.dtype), layout.shape)
    if buffer.dtype in MOVED_AS_BYTES:
        written = write(lax.bitcast_convert_type(buffer, jnp.uint8), layout, lax.bitcast_convert_type(value, jnp.uint8))
        return lax.bitcast_convert_type(written, buffer.dtype)
    n = layout.numel
    if n == 0:
        return buffer
    if layout.dense_order() is None:
        return buffer.at[layout.indices()].set(value)
    flat = flatten(value, layout)
    if isinstance(layout.offset, int) and layout.offset == 0 and buffer.shape[0] == n:
        return flat
    return lax.dynamic_update_slice(buffer, flat, (layout.offset,))


def covers(layout: Layout, buffer_length: int) -> bool:
    return layout.offset == 0 and layout.numel == buffer_length and layout.dense_order() is not None


def apply_math_bits(value, bits):
    """The values a conj- and/or neg-bit view means, from what it stores; (conj, neg) are
    self-inverse, so the same turns a meant value into what to store through such a view."""
    conj, neg = bits
    if conj:
        value = jnp.conj(value)
    if neg:
        value = -value
    return value
