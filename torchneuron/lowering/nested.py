"""Lowerings: the dense kernels under jagged nested tensors (`torch.nested`, `layout=torch.jagged`).

A jagged nested tensor is a Python subclass over dense `values` (total_L, ...) and `offsets` (B + 1,);
its ops are dense ops on those, and two kernels of their own convert between that packed form and a
padded (B, max_len, ...) tensor: `to_padded_tensor`, softmax and layer norm over the ragged dimension
and their gradients. Both are gathers with static shapes (the maximum length and total_L are
arguments), so they run in eager programs and compiled graphs alike.
"""
from __future__ import annotations

import jax.numpy as jnp

from . import aten, lowers, refused


def _fill(padding_value, dtype):
    """The padding as `dtype`; an infinite padding of an integer tensor clamps to the dtype's range (CPU's)."""
    if jnp.issubdtype(dtype, jnp.integer) and abs(padding_value) == float("inf"):
        info = jnp.iinfo(dtype)
        return jnp.asarray(info.max if padding_value > 0 else info.min, dtype)
    return jnp.asarray(padding_value).astype(dtype)


@lowers(aten._jagged_to_padded_dense_forward.default)
def jagged_to_padded_dense(values, offsets, max_lengths, padding_value=0.0):
    """values (total_L, D) -> (B, max_len, D): row t of sequence b is values[offsets[b] + t] where t is
    within its length, else the padding."""
    (offsets,), (length,) = offsets, max_lengths
    row = offsets[:-1, None] + jnp.arange(length, dtype=offsets.dtype)[None, :]
    inside = row < offsets[1:, None]
    shape = inside.shape + (1,) * (values.ndim - 1)
    if values.shape[0] == 0:
        return jnp.broadcast_to(_fill(padding_value, values.dtype), shape[:2] + values.shape[1:])
    rows = values[jnp.clip(row, 0, values.shape[0] - 1)]
    return jnp.where(inside.reshape(shape), rows, _fill(padding_value, values.dtype))


def _padded_dense_to_jagged_meta(dense, offsets, total_L=None):
    if total_L is None:  # the length is offsets[-1], a value on the device
        raise RuntimeError("neuron: aten._padded_dense_to_jagged_forward needs total_L (the jagged tensor's "
                           "total length) on neuron tensors; pass it (sum_S= in nested_from_padded)")
    return dense.new_empty((total_L,) + tuple(dense.shape[2:]))


@lowers(aten._padded_dense_to_jagged_forward.default, meta=_padded_dense_to_jagged_meta)
def padded_dense_to_jagged(dense, offsets, total_L=None):
    """(B, max_len, D) -> values (total_L, D): packed row i is dense[b, i - offsets[b]] for the last
    sequence b starting at or before i."""
    (offsets,) = offsets
    i = jnp.arange(total_L, dtype=offsets.dtype)
    b = jnp.searchsorted(offsets, i, side="right") - 1
    flat = dense.reshape((dense.shape[0] * dense.shape[1],) + dense.shape[2:])
    return flat[b * dense.shape[1] + i - offsets[b]]


# The out= form's composite kernel fills a dense `out` from the nested result; on neuron that
# crashes the process (testing/crash_sweep.py found it; CPU survives), so it is refused.
refused("its composite kernel fills a dense out= tensor from a nested result, which neuron cannot; call "
        "torch._nested_from_padded without out=", aten._nested_from_padded.out)
