"""nn.functional.embedding_bag: sums, means or maxima of embedding rows over bags of indices.

Bags are given by `offsets` (where each bag starts in the flat `indices`); `offset2bag` maps each
index to its bag. Besides the values, CPU's kernel returns offset2bag, bag sizes and the rows the
maxima came from, with shapes that depend on the mode and on whether its summing fast path ran;
backward reads them. Their shapes come from the meta kernel (`result_shapes`): CPU's in eager mode
(the lowering's `meta`), CUDA's in graphs (what PyTorch's fake kernels record for a non-CPU device).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from . import aten, lowers

SUM, MEAN, MAX = 0, 1, 2
_FAST_DTYPES = (jnp.float32, jnp.float16, jnp.bfloat16)


def _accumulator(dtype):
    return jnp.promote_types(dtype, jnp.float32)


def bag_of_each_index(offsets, n: int, include_last_offset: bool):
    """The bag of each of the n indices: a count of bag starts at or before it, less one. With
    include_last_offset the last offset ends the last bag and the bag runs to the end of indices."""
    starts = offsets[:-1] if include_last_offset else offsets
    marks = jnp.zeros(n + 1, offsets.dtype).at[starts].add(1, mode="drop").at[0].add(-1)
    return jnp.cumsum(marks)[:n]


def fast_select(weight_dtype, padding_idx, weight_contiguous) -> bool:
    """Whether CPU sums (and averages) bags by its index-select-and-add fast path."""
    return jnp.dtype(weight_dtype) in map(jnp.dtype, _FAST_DTYPES) and weight_contiguous and padding_idx < 0


def _maxima(rows, valid, bag, num_bags, indices):
    """CPU's loop: a bag's first row, then any strictly greater one. So a NaN first row stays, a
    later NaN never wins, and ties keep the earliest row."""
    n = rows.shape[0]
    clean = jnp.where(valid[:, None] & ~jnp.isnan(rows), rows, -jnp.inf)
    best = jax.ops.segment_max(clean, bag, num_bags)
    position = jnp.arange(n)[:, None]
    hit = valid[:, None] & (clean == best[bag])
    chosen = jax.ops.segment_min(jnp.where(hit, position, n), bag, num_bags)
    first = jax.ops.segment_min(jnp.where(valid, jnp.arange(n), n), bag, num_bags)
    first_is_nan = (first < n) & jnp.isnan(rows[jnp.minimum(first, n - 1)]).T
    chosen = jnp.where(first_is_nan.T, first[:, None], chosen)
    empty = chosen >= n
    chosen = jnp.minimum(chosen, n - 1)
    values = jnp.where(empty, 0, jnp.take_along_axis(rows, chosen, axis=0))
    return values, jnp.where(empty, 0, indices[chosen])


def _fit(x, length: int):
    """x cut or zero-padded to `length` entries."""
    return jnp.pad(x[:length], (0, max(0, length - x.shape[0])))


def _embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx,
                   weight_contiguous, result_shapes):
    index_dtype = jnp.promote_types(indices.dtype, offsets.dtype)
    indices, offsets = indices.astype(index_dtype), offsets.astype(index_dtype)
    n, d = indices.shape[0], weight.shape[1]
    num_bags = offsets.shape[0] - int(include_last_offset)
    acc = _accumulator(weight.dtype)
    bag = bag_of_each_index(offsets, n, include_last_offset)
    valid = indices != padding_idx
    rows = jnp.take(weight, indices, axis=0).astype(acc)
    count = jax.ops.segment_sum(valid.astype(index_dtype), bag, num_bags)
    summed = valid
    if include_last_offset and mode != MAX and fast_select(weight.dtype, padding_idx, weight_contiguous):
        # CPU's fast path ends the last bag at the last offset, its other path (and the bag
        # sizes) at the end of indices: they differ when the last offset is not len(indices)
        summed = valid & (jnp.arange(n) < offsets[-1])

    if mode == MAX:
        if n == 0:
            out, max_indices = jnp.zeros((num_bags, d), acc), jnp.zeros((num_bags, d), index_dtype)
        else:
            out, max_indices = _maxima(rows, valid, bag, num_bags, indices)
    else:
        if per_sample_weights is not None:
            rows = rows * per_sample_weights.astype(acc)[:, None]
        out = jax.ops.segment_sum(jnp.where(summed[:, None], rows, 0), bag, num_bags)
        if mode == MEAN:
            out = out / jnp.maximum(count, 1).astype(acc)[:, None]
        else:  # CPU leaves bag sizes zero for sums
            count = jnp.zeros_like(count)
    # The auxiliary results' shapes are the meta kernel's: CPU's (offset2bag empty after its summing
    # fast path; bag sizes, copied into max_indices outside max mode) or, in graphs, CUDA's.
    _, bag_shape, size_shape, max_shape = result_shapes
    bag = bag if bag_shape[0] == n else jnp.zeros(0, index_dtype)
    bag_size = _fit(count, size_shape[0])
    if mode != MAX:
        max_indices = _fit(count, max_shape[0])
    return out.astype(weight.dtype), bag, bag_size, max_indices


_OPTIONS = {"contiguity": ("weight",), "result_shapes": True}


def _cpu_layout(op, forward_only):
    """The meta function of `op` with CPU's auxiliary outputs (PyTorch's meta kernel gives CUDA's for
    any tensor not on CPU): offset2bag is empty when the summing fast path skips it, bag sizes and max
    indices are per bag (per offset for sums in the forward-only variant) and index-typed as indices
    and offsets together."""
    def meta(weight, indices, offsets, scale_grad_by_freq=False, mode=SUM, sparse=False, per_sample_weights=None,
             include_last_offset=False, padding_idx=-1):
        output = op(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
                    include_last_offset, padding_idx)[0]
        index = torch.promote_types(indices.dtype, offsets.dtype)
        fast = mode == SUM and fast_select(str(weight.dtype).removeprefix("torch."), padding_idx,
                                           weight.is_contiguous())
        offset2bag = indices.new_empty((0 if fast else indices.shape[0],), dtype=index)
        bags = offsets.shape[0] if forward_only and mode == SUM else output.shape[0]
        bag_size = indices.new_empty((bags,), dtype=index)
        max_indices = indices.new_empty(output.shape if mode == MAX else (bags,), dtype=index)
        return output, offset2bag, bag_size, max_indices
    return meta


@lowers(aten._embedding_bag.default, meta=_cpu_layout(aten._embedding_bag.default, False), **_OPTIONS)
@lowers(aten._embedding_bag_forward_only.default,
        meta=_cpu_layout(aten._embedding_bag_forward_only.default, True), **_OPTIONS)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=SUM, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1, *, weight_contiguous,
                  result_shapes):
    return _embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx,
                          weight_contiguous, result_shapes)


@lowers(aten._embedding_bag_dense_backward.default)
def embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                 scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1):
    acc = _accumulator(grad.dtype)
    g = grad.astype(acc)
    d = g.shape[1]
    if mode == MAX:  # each bag's gradient goes to the rows its maxima came from; empty bags give none
        g = jnp.where((bag_size[:g.shape[0]] != 0)[:, None], g, 0)
        columns = jnp.broadcast_to(jnp.arange(d), maximum_indices.shape)
        out = jnp.zeros((num_weights, d), acc).at[maximum_indices, columns].add(g)
        return out.astype(grad.dtype)
    scale = jnp.ones(indices.shape[0], acc)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.astype(acc)
    if scale_grad_by_freq:
        scale = scale / _frequency_as_cpu(indices, num_weights, acc)
    if mode == MEAN:
        size = bag_size[offset2bag].astype(acc)
        scale = jnp.where(size != 0, scale / jnp.where(size != 0, size, 1), scale)
    # an index past the last bag (include_last_offset with a last offset short of the end, where
    # the forward left it out) gets no gradient; CPU reads past the gradient there
    scale = jnp.where((indices != padding_idx) & (offset2bag < g.shape[0]), scale, 0)
    out = jnp.zeros((num_weights, d), acc).at[indices].add(g[offset2bag] * scale[:, None])
    return out.astype(grad.dtype)


def _frequency_as_cpu(indices, num_weights, dtype):
    """The divisor CPU's kernel uses for scale_grad_by_freq. It walks the sorted indices one group of
    equal values at a time and divides group r by the count of the r-th *sorted index*, not of the
    group's own value; the two agree only when no index repeats before it."""
    counts = jnp.zeros(num_weights, dtype).at[indices].add(1)
    ordered = jnp.sort(indices)
    starts = jnp.concatenate([jnp.ones(1, bool), ordered[1:] != ordered[:-1]])
    group = jnp.cumsum(starts) - 1  # of each sorted position
    rank = group[jnp.searchsorted(ordered, indices)]
    return counts[ordered[rank]]


@lowers(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    n = indices.shape[0]
    if offset2bag.shape[0] != n:  # the summing fast path left it empty: CPU recomputes it
        offset2bag = bag_of_each_index(offsets, n, False)
    acc = _accumulator(grad.dtype)
    dots = jnp.sum(grad.astype(acc)[offset2bag] * jnp.take(weight, indices, axis=0).astype(acc), axis=1)
    return jnp.where((indices != padding_idx) & (offset2bag < grad.shape[0]), dots, 0).astype(grad.dtype)


@lowers(aten._embedding_bag_backward.default)
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                           scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    if sparse:
        raise NotImplementedError("embedding_bag(sparse=True) on neuron: sparse gradients are not supported; "
                                  "use sparse=False")
    if offset2bag.shape[0] != indices.shape[0]:  # the summing fast path left it empty
        offset2bag = bag_of_each_index(offsets, indices.shape[0], False)
    return embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                        scale_grad_by_freq, mode, per_sample_weights, padding_idx)
