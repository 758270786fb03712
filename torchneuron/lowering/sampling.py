"""Lowerings: resampling (upsample_*, grid_sampler_*).

Upsampling is separable: along each spatial axis every output position reads a few input
positions ("taps") with fixed weights. The taps and weights depend only on sizes, scales and
align_corners, so they are numpy constants computed at trace time with PyTorch's index math in
the op's computation precision (float32 for float32 and half inputs, float64 for float64); the
device work is one gather and one weighted sum per axis. Backward ops are jax.vjp of the forward.

grid_sampler reads at data-dependent coordinates: it gathers the corner taps of each grid point
(zero weight where a tap falls outside with padding_mode="zeros").
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from . import aten, lowers, opmath

_CUBIC_A = -0.75  # PyTorch's bicubic convolution constant


def _np_float(dtype):
    return np.float64 if dtype == jnp.float64 else np.float32


# --------------------------------------------------------------------------- index math
def _linear_scale(n_in, n_out, align_corners, scale, ft):
    """Input distance per output step (PyTorch's area_pixel_compute_scale)."""
    if align_corners:
        return ft((n_in - 1) / (n_out - 1)) if n_out > 1 else ft(0)
    if scale is not None and scale > 0:
        return ft(1.0 / scale)
    return ft(n_in) / ft(n_out)


def _source(n_in, n_out, align_corners, scale, ft, clamp):
    """Real-valued input coordinate of every output index."""
    s = _linear_scale(n_in, n_out, align_corners, scale, ft)
    dst = np.arange(n_out, dtype=ft)
    if align_corners:
        return s * dst
    src = s * (dst + ft(0.5)) - ft(0.5)
    return np.maximum(src, ft(0)) if clamp else src


def _nearest_taps(n_in, n_out, scale, exact):
    # Nearest always computes in float32, whatever the input dtype.
    s = np.float32(1.0 / scale) if scale is not None and scale > 0 else np.float32(n_in) / np.float32(n_out)
    dst = np.arange(n_out, dtype=np.float32)
    if exact:
        idx = np.floor((dst + np.float32(0.5)) * s)
    elif n_out == n_in:
        idx = dst
    elif n_out == 2 * n_in:
        idx = dst // 2
    else:
        idx = np.floor(dst * s)
    return np.minimum(idx.astype(np.int64), n_in - 1)[:, None], None


def _linear_taps(n_in, n_out, align_corners, scale, ft):
    src = _source(n_in, n_out, align_corners, scale, ft, clamp=True)
    i0 = src.astype(np.int64)
    i1 = i0 + (i0 < n_in - 1)
    lam = np.clip(src - i0.astype(ft), ft(0), ft(1)).astype(ft)
    return np.stack([i0, i1], 1), np.stack([ft(1) - lam, lam], 1)


def _cubic_weights(t, a):
    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], 1)


def _cubic_taps(n_in, n_out, align_corners, scale, ft):
    src = _source(n_in, n_out, align_corners, scale, ft, clamp=False)
    base = np.floor(src)
    t = (src - base).astype(ft)
    idx = np.clip(base.astype(np.int64)[:, None] + np.arange(-1, 3)[None, :], 0, n_in - 1)
    return idx, _cubic_weights(t, ft(_CUBIC_A)).astype(ft)


def _aa_filter(kind, x):
    x = np.abs(x)
    if kind == "linear":
        return np.where(x < 1, 1 - x, 0)
    a = -0.5  # the antialiased bicubic filter uses a = -0.5
    return np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0))


def _aa_taps(kind, n_in, n_out, align_corners, scale, ft):
    """Antialiased weights: the filter stretched by the downscale factor, normalised per output."""
    s = _linear_scale(n_in, n_out, align_corners, scale, ft)
    width = 1.0 if kind == "linear" else 2.0
    support = width * s if s >= 1 else ft(width)
    inv = 1 / s if s >= 1 else ft(1)
    center = s * (np.arange(n_out, dtype=ft) + ft(0.5))
    lo = np.maximum((center - support + ft(0.5)).astype(np.int64), 0)
    hi = np.minimum((center + support + ft(0.5)).astype(np.int64), n_in)
    taps = int(np.max(hi - lo)) if n_out else 1
    j = np.arange(taps)[None, :]
    idx = lo[:, None] + j
    w = _aa_filter(kind, ((idx - center[:, None] + ft(0.5)) * inv).astype(ft)).astype(ft)
    w = np.where(idx < hi[:, None], w, ft(0))
    total = w.sum(1, keepdims=True)
    w = np.where(total != 0, w / np.where(total != 0, total, 1), w).astype(ft)
    return np.minimum(idx, n_in - 1), w


def _taps(mode, n_in, n_out, align_corners, scale, ft):
    if mode in ("nearest", "nearest-exact"):
        return _nearest_taps(n_in, n_out, scale, mode == "nearest-exact")
    if mode == "linear":
        return _linear_taps(n_in, n_out, align_corners, scale, ft)
    if mode == "cubic":
        return _cubic_taps(n_in, n_out, align_corners, scale, ft)
    return _aa_taps(mode.removeprefix("aa-"), n_in, n_out, align_corners, scale, ft)


def _resample(x, output_size, mode, align_corners, scales):
    spatial = len(output_size)
    xu = x if mode.startswith("nearest") else opmath(x)
    ft = _np_float(xu.dtype)
    for k in range(spatial):
        axis = x.ndim - spatial + k
        idx, w = _taps(mode, x.shape[axis], output_size[k], align_corners, scales[k], ft)
        moved = jnp.moveaxis(xu, axis, -1)
        picked = moved[..., idx]  # (..., out, taps)
        picked = picked[..., 0] if w is None else jnp.sum(picked * jnp.asarray(w, xu.dtype), axis=-1)
        xu = jnp.moveaxis(picked, -1, axis)
    return xu.astype(x.dtype)


def _register(forward_op, backward_op, mode, spatial, align):
    def split(rest):
        rest = list(rest) + [None] * (spatial + align - len(rest))
        return (rest[0] if align else False), rest[align:align + spatial]

    @lowers(forward_op)
    def forward(self, output_size, *rest):
        align_corners, scales = split(rest)
        return _resample(self, output_size, mode, align_corners, scales)

    @lowers(backward_op)
    def backward(grad_output, output_size, input_size, *rest):
        align_corners, scales = split(rest)
        zeros = jnp.zeros(tuple(input_size), grad_output.dtype)
        _, vjp = jax.vjp(lambda x: _resample(x, output_size, mode, align_corners, scales), zeros)
        return vjp(grad_output)[0]

    return forward, backward


_register(aten.upsample_nearest1d.default, aten.upsample_nearest1d_backward.default, "nearest", 1, 0)
_register(aten.upsample_nearest2d.default, aten.upsample_nearest2d_backward.default, "nearest", 2, 0)
_register(aten.upsample_nearest3d.default, aten.upsample_nearest3d_backward.default, "nearest", 3, 0)
_register(aten._upsample_nearest_exact1d.default, aten._upsample_nearest_exact1d_backward.default,
          "nearest-exact", 1, 0)
_register(aten._upsample_nearest_exact2d.default, aten._upsample_nearest_exact2d_backward.default,
          "nearest-exact", 2, 0)
_register(aten._upsample_nearest_exact3d.default, aten._upsample_nearest_exact3d_backward.default,
          "nearest-exact", 3, 0)
_register(aten.upsample_linear1d.default, aten.upsample_linear1d_backward.default, "linear", 1, 1)
_register(aten.upsample_bilinear2d.default, aten.upsample_bilinear2d_backward.default, "linear", 2, 1)
_register(aten.upsample_trilinear3d.default, aten.upsample_trilinear3d_backward.default, "linear", 3, 1)
_register(aten.upsample_bicubic2d.default, aten.upsample_bicubic2d_backward.default, "cubic", 2, 1)
_register(aten._upsample_bilinear2d_aa.default, aten._upsample_bilinear2d_aa_backward.default,
          "aa-linear", 2, 1)
_register(aten._upsample_bicubic2d_aa.default, aten._upsample_bicubic2d_aa_backward.default, "aa-cubic", 2, 1)


# --------------------------------------------------------------------------- grid sampling
_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _clip(coord, size):
    # where(), not clip(): the gradient is 0 on the boundary as in PyTorch
    coord = jnp.where(coord <= 0, jnp.zeros((), coord.dtype), coord)
    return jnp.where(coord >= size - 1, jnp.asarray(size - 1, coord.dtype), coord)


def _reflect(coord, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    coord = jnp.abs(coord - low)
    extra = jnp.fmod(coord, span)
    flips = jnp.floor(coord / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _pad_coordinate(coord, size, padding_mode, align_corners):
    if padding_mode == _BORDER:
        return _clip(coord, size)
    if padding_mode == _REFLECTION:
        if align_corners:
            coord = _reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _reflect(coord, -1, 2 * size - 1)
        return _clip(coord, size)
    return coord


def _gather(plane, idx):
    """plane (C, *spatial); idx: one integer array per spatial axis -> (C, *idx.shape)."""
    return plane[(slice(None),) + tuple(idx)]


def _grid_sample(input, grid, mode, padding_mode, align_corners):
    x = opmath(input)
    g = grid.astype(x.dtype)
    sizes = input.shape[2:]
    spatial = len(sizes)
    # grid's last axis lists coordinates fastest axis first (x = width, y = height, z = depth)
    coords = [_unnormalize(g[..., spatial - 1 - k], sizes[k], align_corners) for k in range(spatial)]

    def read(positions):
        """Sum of weight * input over taps; positions: [(index per axis, weight)]."""
        total = 0
        for idx, w in positions:
            inside = jnp.ones(w.shape, jnp.bool_)
            for k, i in enumerate(idx):
                inside = inside & (i >= 0) & (i < sizes[k])
            safe = [jnp.clip(i, 0, sizes[k] - 1) for k, i in enumerate(idx)]
            values = jax.vmap(_gather)(x, safe)  # (N, C, *out)
            total = total + values * jnp.where(inside, w, 0)[:, None]
        return total

    if mode == _BICUBIC:
        base = [jnp.floor(c) for c in coords]
        weights = [_cubic_weights_traced(c - b) for c, b in zip(coords, base)]
        taps = []
        for offsets in itertools.product(range(4), repeat=spatial):
            idx, w = [], 1
            for k, o in enumerate(offsets):
                c = _pad_coordinate(base[k] + (o - 1), sizes[k], padding_mode, align_corners)
                idx.append(c.astype(jnp.int64))
                w = w * weights[k][o]
            taps.append((idx, w))
        return read(taps).astype(input.dtype)

    coords = [_pad_coordinate(c, sizes[k], padding_mode, align_corners) for k, c in enumerate(coords)]
    if mode == _NEAREST:
        idx = [jnp.round(c).astype(jnp.int64) for c in coords]  # half to even, like nearbyint
        return read([(idx, jnp.ones(coords[0].shape, x.dtype))]).astype(input.dtype)
    low = [jnp.floor(c) for c in coords]
    frac = [c - lo for c, lo in zip(coords, low)]
    taps = []
    for corner in itertools.product((0, 1), repeat=spatial):
        idx, w = [], 1
        for k, hi in enumerate(corner):
            idx.append(low[k].astype(jnp.int64) + hi)
            w = w * (frac[k] if hi else 1 - frac[k])
        taps.append((idx, w))
    return read(taps).astype(input.dtype)


def _cubic_weights_traced(t):
    a = _CUBIC_A

    def near(v):
        return ((a + 2) * v - (a + 3)) * v * v + 1

    def far(v):
        return ((a * v - 5 * a) * v + 8 * a) * v - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


# _grid_sampler_2d_cpu_fallback is what grid_sampler_2d computes (CPU's path for unusual inputs); its
# composite kernel would read our memory on the host.
@lowers(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners)


# (its composite kernel is no meta kernel: grid_sampler_2d's gives the same result)
lowers(aten._grid_sampler_2d_cpu_fallback.default, meta=aten.grid_sampler_2d.default)(grid_sampler)


@lowers(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def grid_sampler_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
                          output_mask):
    _, vjp = jax.vjp(lambda x, g: _grid_sample(x, g, interpolation_mode, padding_mode, align_corners),
                     input, grid)
    grad_input, grad_grid = vjp(grad_output)
    # as CPU: no input gradient unless asked for, the grid's always (CPU computes it either way)
    return (grad_input if output_mask[0] else None, grad_grid)


def _grid_sampler_2d_cpu_fallback_backward_meta(grad_output, input, grid, interpolation_mode, padding_mode,
                                                align_corners):
    return aten.grid_sampler_2d_backward.default(grad_output, input, grid, interpolation_mode, padding_mode,
                                                 align_corners, [True, True])


@lowers(aten._grid_sampler_2d_cpu_fallback_backward.default, meta=_grid_sampler_2d_cpu_fallback_backward_meta)
def grid_sampler_cpu_fallback_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners):
    return grid_sampler_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
                                 (True, True))
