"""Lowerings: the three FFT primitives every torch.fft function reaches.

PyTorch's torch.fft.* (fft, ifft, rfft, irfft, hfft, ihfft and their 2-D / n-D forms) are
composites over `_fft_c2c`, `_fft_r2c` and `_fft_c2r`. The primitives never choose a
normalisation from the direction: `normalization` says how to scale (PyTorch's fft_norm_mode:
0 none, 1 by 1/sqrt(n), 2 by 1/n, n the product of the signal sizes) and the transform itself is
unscaled. Multi-dimensional transforms run as one 1-D transform per axis (they are separable),
so any number of axes and any axis order work whatever the backend's FFT supports.
"""
from __future__ import annotations

import math

import jax.numpy as jnp

from . import aten, lowers


def _scale(x, normalization: int, n: int):
    if normalization == 1:
        return x * jnp.asarray(1 / math.sqrt(n), x.real.dtype)
    if normalization == 2:
        return x * jnp.asarray(1 / n, x.real.dtype)
    return x


def _c2c(x, dims, forward: bool):
    """Unscaled complex transform over `dims` (the inverse without its 1/n)."""
    for d in dims:
        if forward:
            x = jnp.fft.fft(x, axis=d, norm="backward")
        else:
            x = jnp.fft.ifft(x, axis=d, norm="forward")
    return x


def _dims(x, dim) -> list[int]:
    return [d % x.ndim for d in dim]


@lowers(aten._fft_c2c.default)
def fft_c2c(self, dim, normalization, forward):
    dims = _dims(self, dim)
    n = math.prod(self.shape[d] for d in dims)
    return _scale(_c2c(self, dims, forward), normalization, n)


@lowers(aten._fft_r2c.default)
def fft_r2c(self, dim, normalization, onesided):
    """Real to complex, forward: a one-sided transform keeps the last dim's n // 2 + 1 bins."""
    dims = _dims(self, dim)
    n = math.prod(self.shape[d] for d in dims)
    if onesided:
        out = _c2c(jnp.fft.rfft(self, axis=dims[-1], norm="backward"), dims[:-1], True)
    else:
        out = _c2c(self, dims, True)
    return _scale(out, normalization, n)


@lowers(aten._fft_c2r.default)
def fft_c2r(self, dim, normalization, last_dim_size):
    """Complex (one-sided, Hermitian) to real, backward: the last dim grows to `last_dim_size`,
    read from its first last_dim_size // 2 + 1 bins."""
    dims = _dims(self, dim)
    n = math.prod(self.shape[d] for d in dims[:-1]) * last_dim_size
    x = _c2c(self, dims[:-1], False)
    out = jnp.fft.irfft(x, n=last_dim_size, axis=dims[-1], norm="forward")
    return _scale(out, normalization, n)
