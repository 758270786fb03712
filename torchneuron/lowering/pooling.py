"""Lowerings: pooling (max, average, adaptive; 1-d to 3-d), unpooling, reflection/replication
padding, im2col/col2im.

2-d max and average pools stack every kernel tap's strided view of the padded input. Other
windows are tables of flat input positions built with numpy at trace time: for each output cell
the input positions its window covers, and whether each is inside the (unpadded) input. One
gather reads all windows; max pools return PyTorch's flat indices into the spatial dims, and
their backwards scatter-add the gradient at those indices. Other backwards are jax.vjp of the
forward.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import aten, lowers, opmath


# ------------------------------------------------------------------------- 2-d pooling
def _pair(v, n=2):
    return tuple(v) * n if len(v) == 1 else tuple(v)


def _pool_out_size(size, k, s, p, d, ceil_mode):
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:  # the last window must start inside the input
        out -= 1
    return out


def _pool_geometry(shape, kernel_size, stride, padding, dilation, ceil_mode):
    k = _pair(kernel_size)
    s = _pair(stride) if stride else k
    p = _pair(padding)
    d = _pair(dilation)
    out = tuple(_pool_out_size(shape[i - 2], k[i], s[i], p[i], d[i], ceil_mode) for i in range(2))
    return k, s, p, d, out


def _windows(x, k, s, p, d, out, fill):
    """(..., kh*kw, oh, ow): every kernel tap's view of x, padded with `fill`."""
    high = [max(0, (o - 1) * ss + dd * (kk - 1) + 1 - n - pp)
            for o, ss, dd, kk, n, pp in zip(out, s, d, k, x.shape[-2:], p)]
    pad = [(0, 0)] * (x.ndim - 2) + [(p[0], high[0]), (p[1], high[1])]
    xp = jnp.pad(x, pad, constant_values=fill)
    taps = []
    for i in range(k[0]):
        for j in range(k[1]):
            h0, w0 = i * d[0], j * d[1]
            taps.append(xp[..., h0:h0 + (out[0] - 1) * s[0] + 1:s[0], w0:w0 + (out[1] - 1) * s[1] + 1:s[1]])
    return jnp.stack(taps, axis=-3)


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


@lowers(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    k, s, p, d, out = _pool_geometry(self.shape, kernel_size, stride, padding, dilation, ceil_mode)
    taps = _windows(self, k, s, p, d, out, _lowest(self.dtype))
    # NaN wins, as in PyTorch's kernel; otherwise the first maximum.
    tap = jnp.argmax(jnp.where(jnp.isnan(taps), jnp.inf, taps), axis=-3)
    values = jnp.take_along_axis(taps, tap[..., None, :, :], axis=-3)[..., 0, :, :]
    rows = (np.arange(out[0]) * s[0] - p[0])[:, None] + (tap // k[1]) * d[0]
    cols = (np.arange(out[1]) * s[1] - p[1])[None, :] + (tap % k[1]) * d[1]
    return values, (rows * self.shape[-1] + cols).astype(jnp.int64)


@lowers(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    planes = math.prod(self.shape[:-2])
    g = opmath(grad_output).reshape(planes, -1)
    idx = indices.reshape(planes, -1)
    grad = jnp.zeros((planes, self.shape[-2] * self.shape[-1]), g.dtype)
    grad = grad.at[jnp.arange(planes)[:, None], idx].add(g)
    return grad.reshape(self.shape).astype(self.dtype)


def _avg_divisor(shape, k, s, p, out, count_include_pad):
    """(oh, ow) numpy array: how many elements each window averages over."""
    counts = []
    for n, kk, ss, pp, o in zip(shape[-2:], k, s, p, out):
        start = np.arange(o) * ss - pp
        end = np.minimum(start + kk, n + pp)
        if not count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, n)
        counts.append(end - start)
    return np.outer(counts[0], counts[1])


def _reach(sizes, k, p):
    """The kernel cut to the taps that can read input: a window starts at least `p` before the input,
    so its taps past `n + p` read only padding past the input's end (which sums to nothing; the
    divisor counts the whole kernel where PyTorch does)."""
    return tuple(min(kk, n + pp) for kk, n, pp in zip(k, sizes, p))


def _avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    k, s, p, _, out = _pool_geometry(x.shape, kernel_size, stride, padding, (1,), ceil_mode)
    # One reduce_window rather than _windows' k*k slices, its window cut to `reach`: EfficientNet pools
    # with kernel_size=hidden_dim (1280) over a few pixels, and summing every window's 1280x1280 taps of
    # zero padding took XLA:CPU 10 s (its backward 22 s) on 4096 planes of 2x2.
    reach = _reach(x.shape[-2:], k, p)
    high = [max(0, (o - 1) * ss + kk - n - pp) for o, ss, kk, n, pp in zip(out, s, reach, x.shape[-2:], p)]
    lead = (1,) * (x.ndim - 2)
    xu = opmath(x)
    total = lax.reduce_window(xu, np.array(0, xu.dtype), lax.add, lead + reach, lead + s,
                              [(0, 0)] * (x.ndim - 2) + [(p[0], high[0]), (p[1], high[1])])
    total = total[..., :out[0], :out[1]]
    divisor = divisor_override or _avg_divisor(x.shape, k, s, p, out, count_include_pad)
    return (total / jnp.asarray(divisor, total.dtype)).astype(x.dtype)


@lowers(aten.avg_pool2d.default)
def avg_pool2d(self, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool2d(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lowers(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    _, vjp = jax.vjp(lambda x: _avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                           divisor_override), self)
    return vjp(grad_output)[0]


def _adaptive_windows(n, o, dtype):
    """(o, n) 0/1 matrix of which inputs each adaptive window covers, and (o,) window sizes."""
    i = np.arange(o)
    start, end = (i * n) // o, -((-(i + 1) * n) // o)
    member = (np.arange(n)[None, :] >= start[:, None]) & (np.arange(n)[None, :] < end[:, None])
    return jnp.asarray(member, dtype), end - start


def _adaptive_avg_pool2d_fwd(x, output_size):
    xu = opmath(x)
    rows, nr = _adaptive_windows(x.shape[-2], output_size[0], xu.dtype)
    cols, nc = _adaptive_windows(x.shape[-1], output_size[1], xu.dtype)
    total = jnp.einsum("...hw,ih,jw->...ij", xu, rows, cols)
    return (total / jnp.asarray(np.outer(nr, nc), xu.dtype)).astype(x.dtype)


@lowers(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(self, output_size):
    return _adaptive_avg_pool2d_fwd(self, output_size)


@lowers(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output, self):
    _, vjp = jax.vjp(lambda x: _adaptive_avg_pool2d_fwd(x, grad_output.shape[-2:]), self)
    return vjp(grad_output)[0]


# ------------------------------------------------------------------------- N-d pooling
def _expand(v, n):
    v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    return v * n if len(v) == 1 else v


def _table(sizes, starts, taps, step):
    """Flat input positions (cells, taps) and validity of windows that start at `starts[k]` (per
    axis, one per output index) and read `taps[k]` positions `step[k]` apart."""
    flat = np.zeros((1, 1), np.int64)
    valid = np.ones((1, 1), bool)
    for n, start, t, d in zip(sizes, starts, taps, step):
        pos = np.asarray(start)[:, None] + np.arange(t)[None, :] * d  # (out_k, t_k)
        ok = (pos >= 0) & (pos < n)
        flat = (flat[:, None, :, None] * n + pos[None, :, None, :]).reshape(flat.shape[0] * len(start), -1)
        valid = (valid[:, None, :, None] & ok[None, :, None, :]).reshape(flat.shape)
    return flat, valid


def _read(x, spatial, flat):
    """x (..., *sizes) at `flat` (cells, taps) positions -> (..., cells, taps)."""
    lead, sizes = x.shape[:x.ndim - spatial], x.shape[x.ndim - spatial:]
    return x.reshape(lead + (math.prod(sizes),))[..., np.clip(flat, 0, None)]


def _pick_max(x, spatial, flat, valid, out):
    taps = jnp.where(valid, _read(x, spatial, flat), _lowest(x.dtype))
    tap = jnp.argmax(jnp.where(jnp.isnan(taps), jnp.inf, taps), axis=-1)  # NaN wins, else first max
    values = jnp.take_along_axis(taps, tap[..., None], -1)[..., 0]
    index = jnp.asarray(flat)[jnp.arange(flat.shape[0]), tap]
    lead = x.shape[:x.ndim - spatial]
    return values.reshape(lead + tuple(out)), index.reshape(lead + tuple(out)).astype(jnp.int64)


def _scatter_max_grad(grad_output, self, indices, spatial):
    lead = self.shape[:self.ndim - spatial]
    planes = math.prod(lead)
    cells = math.prod(grad_output.shape[grad_output.ndim - spatial:])
    g = opmath(grad_output).reshape(planes, cells)
    grad = jnp.zeros((planes, math.prod(self.shape[self.ndim - spatial:])), g.dtype)
    grad = grad.at[jnp.arange(planes)[:, None], indices.reshape(planes, cells)].add(g)
    return grad.reshape(self.shape).astype(self.dtype)


def _geometry(x, spatial, kernel_size, stride, padding, dilation, ceil_mode):
    k = _expand(kernel_size, spatial)
    s = _expand(stride, spatial) if stride else k
    p = _expand(padding, spatial)
    d = _expand(dilation, spatial)
    sizes = x.shape[x.ndim - spatial:]
    out = tuple(_pool_out_size(n, *args, ceil_mode) for n, *args in zip(sizes, k, s, p, d))
    starts = [np.arange(o) * ss - pp for o, ss, pp in zip(out, s, p)]
    return sizes, k, s, p, d, out, starts


# ---------------------------------------------------------------------------- max pooling
@lowers(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(self, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    sizes, k, _, _, d, out, starts = _geometry(self, 3, kernel_size, stride, padding, dilation, ceil_mode)
    flat, valid = _table(sizes, starts, k, d)
    return _pick_max(self, 3, flat, valid, out)


@lowers(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode,
                                     indices):
    return _scatter_max_grad(grad_output, self, indices, 3)


def _adaptive_bounds(n, o):
    i = np.arange(o)
    return (i * n) // o, -((-(i + 1) * n) // o)


def _adaptive_max(x, output_size):
    spatial = len(output_size)
    sizes = x.shape[x.ndim - spatial:]
    bounds = [_adaptive_bounds(n, o) for n, o in zip(sizes, output_size)]
    taps = [int(np.max(end - start)) if len(start) else 1 for start, end in bounds]
    flat, _ = _table(sizes, [b[0] for b in bounds], taps, (1,) * spatial)
    # a tap is valid when it lies before its own window's end (windows vary in size)
    inside = np.ones((1, 1), bool)
    for (start, end), t in zip(bounds, taps):
        ok = (start[:, None] + np.arange(t)[None, :]) < end[:, None]
        inside = (inside[:, None, :, None] & ok[None, :, None, :]).reshape(inside.shape[0] * len(start), -1)
    return _pick_max(x, spatial, flat, inside, output_size)


@lowers(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(self, output_size):
    return _adaptive_max(self, tuple(output_size))


@lowers(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _scatter_max_grad(grad_output, self, indices, 2)


@lowers(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _scatter_max_grad(grad_output, self, indices, 3)


def _fractional_starts(sample, n, o, k):
    """Window starts (..., o) from a uniform sample in [0, 1) per plane, as PyTorch draws them."""
    if o == 1:
        return jnp.full(sample.shape + (1,), n - k, jnp.int64)
    alpha = jnp.asarray((n - k) / (o - 1), sample.dtype)
    i = jnp.arange(o - 1, dtype=sample.dtype)
    seq = ((i + sample[..., None]) * alpha).astype(jnp.int64) - (sample * alpha).astype(jnp.int64)[..., None]
    return jnp.concatenate([seq, jnp.full(sample.shape + (1,), n - k, jnp.int64)], -1)


def _fractional_max(x, kernel_size, output_size, samples):
    spatial = len(output_size)
    sizes = x.shape[x.ndim - spatial:]
    k = _expand(kernel_size, spatial)
    # samples (N, C, spatial): PyTorch's 2-d kernel reads them as (width, height), its 3-d
    # kernel as (depth, height, width)
    s = opmath(samples).reshape(x.shape[:x.ndim - spatial] + (spatial,))
    order = (1, 0) if spatial == 2 else (0, 1, 2)
    flat = jnp.zeros(s.shape[:-1] + (1, 1), jnp.int64)
    for a in range(spatial):
        start = _fractional_starts(s[..., order[a]], sizes[a], output_size[a], k[a])
        pos = start[..., :, None] + jnp.arange(k[a])  # (..., o, k)
        flat = (flat[..., :, None, :, None] * sizes[a] + pos[..., None, :, None, :])
        flat = flat.reshape(flat.shape[:-4] + (flat.shape[-4] * flat.shape[-3], -1))
    lead = x.shape[:x.ndim - spatial]
    taps = jnp.take_along_axis(x.reshape(lead + (1, math.prod(sizes))), flat.reshape(lead + (1, math.prod(flat.shape[-2:]))), -1)
    taps = taps.reshape(flat.shape)
    tap = jnp.argmax(jnp.where(jnp.isnan(taps), jnp.inf, taps), axis=-1)
    values = jnp.take_along_axis(taps, tap[..., None], -1)[..., 0]
    index = jnp.take_along_axis(flat, tap[..., None], -1)[..., 0]
    return values.reshape(lead + tuple(output_size)), index.reshape(lead + tuple(output_size))


@lowers(aten.fractional_max_pool2d.default, aten.fractional_max_pool3d.default)
def fractional_max_pool(self, kernel_size, output_size, random_samples):
    return _fractional_max(self, kernel_size, tuple(output_size), random_samples)


@lowers(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_max_grad(grad_output, self, indices, 2)


@lowers(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_max_grad(grad_output, self, indices, 3)


def _unpool(x, indices, output_size):
    spatial = len(output_size)
    lead = x.shape[:x.ndim - spatial]
    planes = math.prod(lead)
    out = jnp.zeros((planes, math.prod(output_size)), x.dtype)
    cells = math.prod(x.shape[x.ndim - spatial:])
    out = out.at[jnp.arange(planes)[:, None], indices.reshape(planes, cells)].set(x.reshape(planes, cells),
                                                                                 mode="drop")
    return out.reshape(lead + tuple(output_size))


@lowers(aten.max_unpool2d.default)
def max_unpool2d(self, indices, output_size):
    return _unpool(self, indices, tuple(output_size))


@lowers(aten.max_unpool3d.default)
def max_unpool3d(self, indices, output_size, stride, padding):
    return _unpool(self, indices, tuple(output_size))


# ---------------------------------------------------------------------------- average pooling
def _avg_pool(x, spatial, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    sizes, k, _, p, d, out, starts = _geometry(x, spatial, kernel_size, stride, padding, (1,), ceil_mode)
    flat, valid = _table(sizes, starts, k, d)
    xu = opmath(x)
    total = jnp.sum(jnp.where(valid, _read(xu, spatial, flat), 0), axis=-1)
    if divisor_override:
        divisor = np.full(flat.shape[0], divisor_override)
    elif count_include_pad:  # the window clipped to the padded input
        counts = [np.minimum(st + kk, n + pp) - st for st, kk, n, pp in zip(starts, k, sizes, p)]
        divisor = np.prod(np.stack(np.meshgrid(*counts, indexing="ij")), 0).reshape(-1)
    else:
        divisor = valid.sum(1)
    out_shape = x.shape[:x.ndim - spatial] + out
    return (total / jnp.asarray(divisor, total.dtype)).reshape(out_shape).astype(x.dtype)


@lowers(aten.avg_pool3d.default)
def avg_pool3d(self, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(self, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lowers(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    _, vjp = jax.vjp(lambda x: _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                         divisor_override), self)
    return vjp(grad_output)[0]


def _adaptive_avg(x, output_size):
    xu = opmath(x)
    spatial = len(output_size)
    letters = "defghijk"[:spatial]
    outs = "uvwxyz"[:spatial]
    matrices, counts = [], []
    for n, o in zip(x.shape[x.ndim - spatial:], output_size):
        start, end = _adaptive_bounds(n, o)
        member = (np.arange(n)[None, :] >= start[:, None]) & (np.arange(n)[None, :] < end[:, None])
        matrices.append(jnp.asarray(member, xu.dtype))
        counts.append(end - start)
    spec = f"...{letters}," + ",".join(f"{u}{c}" for u, c in zip(outs, letters)) + f"->...{outs}"
    total = jnp.einsum(spec, xu, *matrices)
    divisor = np.prod(np.stack(np.meshgrid(*counts, indexing="ij")), 0)
    return (total / jnp.asarray(divisor, xu.dtype)).astype(x.dtype)


@lowers(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(self, output_size):
    return _adaptive_avg(self, tuple(output_size))


@lowers(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad_output, self):
    _, vjp = jax.vjp(lambda x: _adaptive_avg(x, grad_output.shape[-3:]), self)
    return vjp(grad_output)[0]


# ---------------------------------------------------------------------------- padding
def _pad(x, padding, mode):
    """padding lists (left, right) pairs from the last axis backwards; a negative amount crops.
    Each output position reads the input position it reflects or clamps to."""
    for i in range(len(padding) // 2):
        axis = x.ndim - 1 - i
        n, left, right = x.shape[axis], padding[2 * i], padding[2 * i + 1]
        pos = np.arange(n + left + right) - left
        if mode == "reflect":
            pos = np.abs(pos)
            pos = np.where(pos > n - 1, 2 * (n - 1) - pos, pos)
        pos = np.clip(pos, 0, n - 1)
        x = jnp.take(x, pos, axis=axis)
    return x


def _register_pad(forward_op, backward_op, mode):
    @lowers(forward_op)
    def forward(self, padding):
        return _pad(self, padding, mode)

    @lowers(backward_op)
    def backward(grad_output, self, padding):
        _, vjp = jax.vjp(lambda x: _pad(x, padding, mode), self)
        return vjp(grad_output)[0]


_register_pad(aten.reflection_pad1d.default, aten.reflection_pad1d_backward.default, "reflect")
_register_pad(aten.reflection_pad2d.default, aten.reflection_pad2d_backward.default, "reflect")
_register_pad(aten.reflection_pad3d.default, aten.reflection_pad3d_backward.default, "reflect")
_register_pad(aten.replication_pad1d.default, aten.replication_pad1d_backward.default, "replicate")
_register_pad(aten.replication_pad2d.default, aten.replication_pad2d_backward.default, "replicate")
_register_pad(aten.replication_pad3d.default, aten.replication_pad3d_backward.default, "replicate")


# ---------------------------------------------------------------------------- im2col / col2im
def _im2col(x, kernel_size, dilation, padding, stride):
    k, d, p, s = (_expand(v, 2) for v in (kernel_size, dilation, padding, stride))
    sizes = x.shape[-2:]
    out = [(n + 2 * pp - dd * (kk - 1) - 1) // ss + 1 for n, kk, dd, pp, ss in zip(sizes, k, d, p, s)]
    starts = [np.arange(o) * ss - pp for o, ss, pp in zip(out, s, p)]
    flat, valid = _table(sizes, starts, k, d)  # (L, kh*kw)
    cols = jnp.where(valid, _read(x, 2, flat), jnp.zeros((), x.dtype))  # (..., C, L, kh*kw)
    cols = jnp.swapaxes(cols, -1, -2)  # (..., C, kh*kw, L)
    return cols.reshape(x.shape[:-3] + (x.shape[-3] * math.prod(k), cols.shape[-1]))


@lowers(aten.im2col.default)
def im2col(self, kernel_size, dilation, padding, stride):
    return _im2col(self, kernel_size, dilation, padding, stride)


@lowers(aten.col2im.default)
def col2im(self, output_size, kernel_size, dilation, padding, stride):
    k = _expand(kernel_size, 2)
    lead = self.shape[:-2]
    channels = self.shape[-2] // math.prod(k)
    zeros = jnp.zeros(lead + (channels,) + tuple(output_size), opmath(self).dtype)
    _, vjp = jax.vjp(lambda x: _im2col(x, kernel_size, dilation, padding, stride), zeros)
    return vjp(opmath(self))[0].astype(self.dtype)
