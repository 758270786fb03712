"""Lowerings: histograms (histc, bincount, histogram, histogramdd).

Counts are scatter-adds of ones (or weights) at each element's bin; where the bin of an element on
an edge depends on rounding, the bins and edges are found CPU's way.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from ..runtime.dtypes import to_torch
from . import aten, lowers
from .factories import _linspace_values


@lowers(aten.histc.default)
def histc(self, bins=100, min=0, max=0):  # the schema's names shadow builtins
    dtype = self.dtype if jnp.issubdtype(self.dtype, jnp.floating) else jnp.float64
    x = self.reshape(-1).astype(dtype)
    lo, hi = jnp.asarray(min, dtype), jnp.asarray(max, dtype)
    # min == max means "the data's range"; a still-empty range widens by one on each side.
    same = lo == hi
    lo, hi = jnp.where(same, jnp.min(x, initial=jnp.inf), lo), jnp.where(same, jnp.max(x, initial=-jnp.inf), hi)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    index = jnp.floor((x - lo) * bins / (hi - lo)).astype(jnp.int64)
    index = jnp.where(x == hi, bins - 1, index)
    inside = (x >= lo) & (x <= hi)
    counts = jnp.zeros(bins, dtype).at[jnp.where(inside, index, bins)].add(1, mode="drop")
    return counts.astype(self.dtype)


@lowers(aten.bincount.default, data_dependent=True)
def bincount(self, weights=None, minlength=0):
    """Counts (or summed weights) of each value in 0..max; the length depends on the data. Weights
    keep float32 and become float64 otherwise, as on CPU."""
    if self.size and int(jnp.min(self)) < 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    length = max(int(jnp.max(self)) + 1 if self.size else 0, minlength)
    if weights is None:
        return jnp.zeros(length, jnp.int64).at[self].add(1)
    dtype = jnp.float32 if weights.dtype == jnp.float32 else jnp.float64
    return jnp.zeros(length, dtype).at[self].add(weights.astype(dtype))


# torch.histogram: counts (or weight sums, or densities) over bin edges, the last bin closed.
def _histogram(x, edges, weight, density):
    x = x.reshape(-1)
    n = edges.shape[0] - 1
    lo, hi = edges[0], edges[-1]
    # CPU's way: a linear guess, then one step left or right against the actual edges
    guess = jnp.floor((x - lo) * n / jnp.where(hi > lo, hi - lo, 1)).astype(jnp.int64)
    guess = jnp.clip(guess, 0, n - 1)
    guess = jnp.where(x < edges[guess], guess - 1, jnp.where(x >= edges[jnp.minimum(guess + 1, n)], guess + 1,
                                                                 guess))
    index = jnp.where(x == hi, n - 1, jnp.clip(guess, 0, n - 1))
    inside = (x >= lo) & (x <= hi)
    w = jnp.ones_like(x) if weight is None else weight.reshape(-1).astype(x.dtype)
    hist = jnp.zeros(n, x.dtype).at[jnp.where(inside, index, n)].add(w, mode="drop")
    if density:
        hist = hist / (jnp.sum(hist) * jnp.diff(edges))
    return hist, edges


def _histogram_meta(self, bins=100, *, range=None, weight=None, density=False):
    # PyTorch has no meta kernel for histogram: bins counts and bins + 1 edges in self's dtype
    n = bins if isinstance(bins, int) else bins.shape[0] - 1
    return (torch.empty((n,), dtype=self.dtype, device="meta"),
            torch.empty((n + 1,), dtype=self.dtype, device="meta"))


@lowers(aten.histogram.bin_ct, meta=_histogram_meta)
def histogram_bin_ct(self, bins=100, *, range=None, weight=None, density=False):
    if range is not None:
        lo, hi = jnp.asarray(range[0], self.dtype), jnp.asarray(range[1], self.dtype)
    else:
        lo, hi = jnp.min(self, initial=0), jnp.max(self, initial=0)
        if self.size:
            lo, hi = jnp.min(self), jnp.max(self)
    lo, hi = jnp.where(lo == hi, lo - 0.5, lo), jnp.where(lo == hi, hi + 0.5, hi)
    return _histogram(self, jnp.linspace(lo, hi, bins + 1).astype(self.dtype), weight, density)


@lowers(aten.histogram.bins_tensor, meta=_histogram_meta)
def histogram_bins_tensor(self, bins, *, weight=None, density=False):
    return _histogram(self, bins.astype(self.dtype), weight, density)


# torch.histogramdd: a histogram over D-dimensional points (the last dimension of self), one set of
# edges per dimension; a point outside any dimension's edges (or NaN) is left out.
def _outer_edges(points, limits):
    """Each dimension's leftmost and rightmost edge: `limits` (lo0, hi0, lo1, hi1, ...), else the
    data's extent ([0, 1] for no points), widened by 0.5 each way where they coincide."""
    d = points.shape[1]
    if limits is not None:
        lo = jnp.asarray(limits[0::2], points.dtype)
        hi = jnp.asarray(limits[1::2], points.dtype)
    elif points.shape[0]:
        lo, hi = jnp.min(points, axis=0), jnp.max(points, axis=0)
    else:
        lo, hi = jnp.zeros(d, points.dtype), jnp.ones(d, points.dtype)
    same = lo == hi
    return jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)


def _edges_from_counts(points, bins, limits):
    lo, hi = _outer_edges(points, limits)
    # CPU's linspace, whose rounding decides the bin of a point on an edge
    return [_linspace_values(lo[i], hi[i], n + 1, to_torch(points.dtype), points.dtype) for i, n in enumerate(bins)]


def _bin_of(x, edges, local_search):
    """The bin of each x among `edges` (the last bin closed). CPU finds it by binary search, or for
    edges it made from counts by a linear guess and an upper-bound search in the three edges around it."""
    n = edges.shape[0] - 1
    if local_search:
        lo, hi = edges[0], edges[-1]
        guess = jnp.clip(jnp.trunc((x - lo) * n / (hi - lo)), 0, n).astype(jnp.int64)
        first = jnp.maximum(guess - 1, 0)
        window = first[:, None] + jnp.arange(3)
        inside = window < jnp.minimum(guess + 2, n + 1)[:, None]
        above = jnp.sum(inside & (edges[jnp.minimum(window, n)] <= x[:, None]), axis=1)
        index = first + above - 1
    else:
        index = jnp.searchsorted(edges, x, side="right") - 1
    return jnp.where(index == n, n - 1, index)


def _histogramdd(self, edges, weight, density, local_search):
    points = self.reshape(-1, self.shape[-1])
    shape = tuple(e.shape[0] - 1 for e in edges)
    keep = jnp.ones(points.shape[0], bool)
    flat = jnp.zeros(points.shape[0], jnp.int64)
    for i, e in enumerate(edges):
        x = points[:, i]
        keep = keep & (x >= e[0]) & (x <= e[-1])
        flat = flat * shape[i] + jnp.clip(_bin_of(x, e, local_search), 0, shape[i] - 1)
    w = jnp.ones(points.shape[0], self.dtype) if weight is None else weight.reshape(-1).astype(self.dtype)
    size = math.prod(shape)
    hist = jnp.zeros(size, self.dtype).at[jnp.where(keep, flat, size)].add(w, mode="drop").reshape(shape)
    if density:
        hist = hist / jnp.sum(hist)
        for i, e in enumerate(edges):
            hist = hist / jnp.diff(e).reshape(tuple(-1 if j == i else 1 for j in range(len(edges))))
    return hist


# No meta kernels for histogramdd's parts: edges per dimension, counts of shape bins.
def _histogramdd_bin_edges_meta(self, bins, *, range=None, weight=None, density=False):
    return [torch.empty((n + 1,), dtype=self.dtype, device="meta") for n in bins]


def _histogramdd_from_bin_cts_meta(self, bins, *, range=None, weight=None, density=False):
    return torch.empty(tuple(bins), dtype=self.dtype, device="meta")


def _histogramdd_from_bin_tensors_meta(self, bins, *, weight=None, density=False):
    return torch.empty(tuple(b.shape[0] - 1 for b in bins), dtype=self.dtype, device="meta")


@lowers(aten._histogramdd_bin_edges.default, meta=_histogramdd_bin_edges_meta)
def histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
    return _edges_from_counts(self.reshape(-1, self.shape[-1]), bins, range)


@lowers(aten._histogramdd_from_bin_cts.default, meta=_histogramdd_from_bin_cts_meta)
def histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
    edges = _edges_from_counts(self.reshape(-1, self.shape[-1]), bins, range)
    return _histogramdd(self, edges, weight, density, local_search=True)


@lowers(aten._histogramdd_from_bin_tensors.default, meta=_histogramdd_from_bin_tensors_meta)
def histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
    return _histogramdd(self, [b.astype(self.dtype) for b in bins], weight, density, local_search=False)
