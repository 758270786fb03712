"""Lowerings: reductions, scans, sorting.

The driver takes output shapes and dtypes from PyTorch's meta kernels, so these functions
only choose the axes and the precision. PyTorch's rules they follow:
- `dim=None` or an empty dim list reduces every axis (except any/all.dims, where [] reduces
  none); a 0-dim tensor accepts dim 0 / -1 and reduces nothing.
- integer and bool sums, products and cumulative sums accumulate in int64; `dtype=` casts the
  input first; float16/bfloat16 accumulate in float32 and round once at the end.
- max/min/argmax/argmin propagate NaN and return the first index of the winner; cummax/cummin
  the last (CPU compares with >=).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..runtime.dtypes import CPU_ACC_TYPE, to_jax
from . import aten, lowers, opmath, overrides_meta
from .padding import Fill, Padding, highest, lowest, pads, reduced_axes, wide

INDEX = jnp.int64


def _axes(x, dim, empty_means_all=True) -> tuple[int, ...]:
    if x.ndim == 0:
        return ()
    if dim is None:
        return tuple(range(x.ndim))
    dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    if not dims:
        return tuple(range(x.ndim)) if empty_means_all else ()
    return tuple(sorted({d % x.ndim for d in dims}))


def _axis(x, dim: int) -> int:
    return dim % x.ndim


def _is_integral(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_


def _accumulating(x, dtype):
    """Input of a sum-like op: cast to `dtype=` if given, integers and bools to int64."""
    if dtype is not None:
        x = x.astype(to_jax(dtype))
    elif _is_integral(x.dtype):
        x = x.astype(INDEX)
    return opmath(x)


def _count(x, axes) -> int:
    return math.prod(x.shape[a] for a in axes)


def _default_float():
    return to_jax(torch.get_default_dtype())


def _as_float(x):
    """Integer inputs of ops that PyTorch computes in the default float dtype."""
    return opmath(x.astype(_default_float()) if _is_integral(x.dtype) else x)


# ------------------------------------------------------------------ sums and products
@lowers(aten.sum.default)
def sum_(self, *, dtype=None):
    return jnp.sum(_accumulating(self, dtype))


@lowers(aten.sum.dim_IntList)
def sum_dim(self, dim, keepdim=False, *, dtype=None):
    return jnp.sum(_accumulating(self, dtype), _axes(self, dim), keepdims=keepdim)


@lowers(aten.nansum.default)
def nansum(self, dim=None, keepdim=False, *, dtype=None):
    x = _accumulating(self, dtype)
    x = jnp.where(jnp.isnan(x), jnp.zeros((), x.dtype), x) if jnp.issubdtype(x.dtype, jnp.inexact) else x
    return jnp.sum(x, _axes(self, dim), keepdims=keepdim)


@lowers(aten.mean.default)
def mean(self, *, dtype=None):
    return mean_dim(self, None, dtype=dtype)


@lowers(aten.mean.dim)
def mean_dim(self, dim, keepdim=False, *, dtype=None):
    axes = _axes(self, dim)
    x = opmath(self.astype(to_jax(dtype)) if dtype is not None else self)
    # sum / n (not jnp.mean) so that an empty reduction is 0/0 = nan as in PyTorch
    return jnp.sum(x, axes, keepdims=keepdim) / jnp.asarray(_count(self, axes), x.dtype)


@lowers(aten.prod.default)
def prod(self, *, dtype=None):
    return jnp.prod(_accumulating(self, dtype))


@lowers(aten.prod.dim_int)
def prod_dim(self, dim, keepdim=False, *, dtype=None):
    return jnp.prod(_accumulating(self, dtype), _axes(self, dim), keepdims=keepdim)


@lowers(aten.count_nonzero.default)
def count_nonzero(self, dim=None):
    return jnp.sum(self != 0, _axes(self, dim), dtype=INDEX)


@lowers(aten.count_nonzero.dim_IntList)
def count_nonzero_dims(self, dim):
    return jnp.sum(self != 0, _axes(self, dim), dtype=INDEX)


@lowers(aten.logsumexp.default)
def logsumexp(self, dim, keepdim=False):
    x = _as_float(self)
    axes = _axes(x, dim)
    # Shift by the max, except where it is infinite (all -inf stays -inf, any +inf gives +inf).
    # Complex inputs shift by the max real part, as CPU does: the result's imaginary part is then
    # the principal argument of the shifted sum, not offset by the max's.
    m = jnp.max(jnp.real(x), axes, keepdims=True, initial=-jnp.inf)
    m = jnp.where(jnp.isinf(m), jnp.zeros((), m.dtype), m).astype(x.dtype)
    out = jnp.log(jnp.sum(jnp.exp(x - m), axes, keepdims=True)) + m
    return out if keepdim else jnp.squeeze(out, axes)


# ------------------------------------------------------------------ extrema
@lowers(aten.amax.default)
def amax(self, dim=(), keepdim=False):
    return jnp.max(self, _axes(self, dim), keepdims=keepdim)


@lowers(aten.amin.default)
def amin(self, dim=(), keepdim=False):
    return jnp.min(self, _axes(self, dim), keepdims=keepdim)


@lowers(aten.max.default)
def max_(self):
    return jnp.max(self)


@lowers(aten.min.default)
def min_(self):
    return jnp.min(self)


@lowers(aten.aminmax.default)
def aminmax(self, *, dim=None, keepdim=False):
    axes = _axes(self, dim)
    return jnp.min(self, axes, keepdims=keepdim), jnp.max(self, axes, keepdims=keepdim)


def _arg(pick, x, dim, keepdim):
    """Index of the first NaN or else the first extreme value (jnp.argmax/argmin agree with CPU)."""
    if x.ndim == 0:
        return jnp.zeros((), INDEX)
    if dim is None:
        index = pick(x.reshape(-1))
        return index.reshape((1,) * x.ndim) if keepdim else index
    return pick(x, _axis(x, dim), keepdims=keepdim)


@lowers(aten.argmax.default)
def argmax(self, dim=None, keepdim=False):
    return _arg(jnp.argmax, self, dim, keepdim)


@lowers(aten.argmin.default)
def argmin(self, dim=None, keepdim=False):
    return _arg(jnp.argmin, self, dim, keepdim)


def _extreme_along(pick, x, dim, keepdim):
    """(values, indices) along `dim`; the values are read at the indices so the two agree."""
    if x.ndim == 0:
        return x, jnp.zeros((), INDEX)
    axis = _axis(x, dim)
    index = pick(x, axis, keepdims=True)
    values = jnp.take_along_axis(x, index, axis)
    if not keepdim:
        values, index = jnp.squeeze(values, axis), jnp.squeeze(index, axis)
    return values, index


@lowers(aten.max.dim)
def max_dim(self, dim, keepdim=False):
    return _extreme_along(jnp.argmax, self, dim, keepdim)


@lowers(aten.min.dim)
def min_dim(self, dim, keepdim=False):
    return _extreme_along(jnp.argmin, self, dim, keepdim)


# ------------------------------------------------------------------ moments
def _moments(x, dim, correction, keepdim):
    """(variance, mean) with divisor max(0, n - correction); correction defaults to 1."""
    x = opmath(x)
    axes = _axes(x, dim)
    n = _count(x, axes)
    mean = jnp.sum(x, axes, keepdims=True) / jnp.asarray(n, x.dtype)
    dev = x - mean
    squares = jnp.real(dev * jnp.conj(dev)) if jnp.iscomplexobj(dev) else dev * dev
    real = squares.dtype
    c = jnp.asarray(1 if correction is None else correction).astype(real)
    var = jnp.sum(squares, axes, keepdims=keepdim) / jnp.maximum(jnp.asarray(n, real) - c, 0)
    return var, mean if keepdim else jnp.squeeze(mean, axes)


@lowers(aten.var.correction)
def var(self, dim=None, *, correction=None, keepdim=False):
    return _moments(self, dim, correction, keepdim)[0]


@lowers(aten.std.correction)
def std(self, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_moments(self, dim, correction, keepdim)[0])


@lowers(aten.var_mean.correction)
def var_mean(self, dim=None, *, correction=None, keepdim=False):
    return _moments(self, dim, correction, keepdim)


@lowers(aten.std_mean.correction)
def std_mean(self, dim=None, *, correction=None, keepdim=False):
    v, m = _moments(self, dim, correction, keepdim)
    return jnp.sqrt(v), m


# ------------------------------------------------------------------ logical
def _truth(x):
    return x if x.dtype == jnp.bool_ else x != 0


@lowers(aten.any.default)
def any_(self):
    return jnp.any(_truth(self))


@lowers(aten.any.dim)
def any_dim(self, dim, keepdim=False):
    return jnp.any(_truth(self), _axes(self, dim), keepdims=keepdim)


@lowers(aten.any.dims)
def any_dims(self, dim=None, keepdim=False):
    return jnp.any(_truth(self), _axes(self, dim, empty_means_all=False), keepdims=keepdim)


@lowers(aten.all.default)
def all_(self):
    return jnp.all(_truth(self))


@lowers(aten.all.dim)
def all_dim(self, dim, keepdim=False):
    return jnp.all(_truth(self), _axes(self, dim), keepdims=keepdim)


@lowers(aten.all.dims)
def all_dims(self, dim=None, keepdim=False):
    return jnp.all(_truth(self), _axes(self, dim, empty_means_all=False), keepdims=keepdim)


def _logical_out_meta(functional):
    """all's and any's out= meta: CPU writes the truth values into a bool or uint8 out whatever the
    input (PyTorch's meta refuses a uint8 input's result into bool; the refusals check the out's dtype)."""
    def meta(*args, out, **kwargs):
        from torch._prims_common.wrappers import _maybe_resize_out
        _maybe_resize_out(out, functional(*args, **kwargs).shape)
        return out
    return meta


for _packet in (aten.any, aten.all):
    for _out, _functional in (("out", "dim"), ("all_out", "default"), ("dims_out", "dims")):
        overrides_meta(getattr(_packet, _out))(_logical_out_meta(getattr(_packet, _functional)))


# ------------------------------------------------------------------ norms
def _vector_norm(x, ord, axes, keepdim):
    """The p-norm of |x| over `axes`. `ord` is traced, so the special orders (inf, -inf, 0, 1,
    2) are branches of one lax.switch rather than Python cases."""
    a = opmath(jnp.abs(x))
    p = jnp.asarray(ord).astype(a.dtype)

    def general(a):
        return jnp.sum(a ** p, axes, keepdims=keepdim) ** (1 / p)

    branches = (
        lambda a: jnp.max(a, axes, keepdims=keepdim, initial=0),
        lambda a: jnp.min(a, axes, keepdims=keepdim, initial=jnp.inf),
        lambda a: jnp.sum(a != 0, axes, keepdims=keepdim).astype(a.dtype),
        lambda a: jnp.sum(a, axes, keepdims=keepdim),
        lambda a: jnp.sqrt(jnp.sum(a * a, axes, keepdims=keepdim)),
        general,
    )
    which = jnp.select([p == jnp.inf, p == -jnp.inf, p == 0, p == 1, p == 2], jnp.arange(5), 5)
    return lax.switch(which, branches, a)


@lowers(aten.linalg_vector_norm.default)
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    x = self.astype(to_jax(dtype)) if dtype is not None else self
    return _vector_norm(x, ord, _axes(x, dim), keepdim)


@lowers(aten.norm.ScalarOpt_dim)
def norm_dim(self, p, dim, keepdim=False):
    return _vector_norm(self, 2 if p is None else p, _axes(self, dim), keepdim)


@lowers(aten.norm.Scalar)
def norm(self, p=2):
    return _vector_norm(self, p, _axes(self, None), False)


# ------------------------------------------------------------------ scans
@lowers(aten.cumsum.default)
def cumsum(self, dim, *, dtype=None):
    x = _accumulating(self, dtype)
    return x if x.ndim == 0 else jnp.cumsum(x, _axis(x, dim))


@lowers(aten.cumprod.default)
def cumprod(self, dim, *, dtype=None):
    x = _accumulating(self, dtype)
    return x if x.ndim == 0 else jnp.cumprod(x, _axis(x, dim))


# CPU's scans accumulate in its acc_type, double for float32: each logcumsumexp output is then the
# correctly rounded value. Its backward exponentiates differences of outputs (near 1e4 in the
# OpInfo), so a float32 scan's last-ulp differences became 3e-3 relative errors in the gradient.


@lowers(aten.logcumsumexp.default)
def logcumsumexp(self, dim):
    x = _as_float(self)
    if x.ndim == 0:
        return x
    axis = _axis(x, dim)
    acc = x.astype(CPU_ACC_TYPE.get(x.dtype, x.dtype))  # CPU scans in its accumulation type
    if not jnp.iscomplexobj(x):
        return lax.cumlogsumexp(acc, axis).astype(x.dtype)
    # CPU accumulates in order; a tree of partial sums would land on other branches of the log
    rows = jnp.moveaxis(acc, axis, 0)

    def step(total, row):
        total = _complex_log_add_exp(total, row)
        return total, total

    _, out = lax.scan(step, jnp.full(rows.shape[1:], -jnp.inf, acc.dtype), rows)  # -inf + 0j, as CPU starts
    return jnp.moveaxis(out, 0, axis).astype(x.dtype)


def _complex_log_add_exp(a, b):
    """log(exp(a) + exp(b)) as CPU's logcumsumexp computes it for complex numbers: the larger real
    part plus log1p(exp(smaller - larger)), so the imaginary part never wraps."""
    a_larger = jnp.real(a) >= jnp.real(b)
    hi, lo = jnp.where(a_larger, a, b), jnp.where(a_larger, b, a)
    nan = jnp.isnan(hi) | jnp.isnan(lo)
    # both real parts infinite and equal: -inf stays, +inf is +inf with an undetermined phase
    same_inf = jnp.isinf(jnp.real(lo)) & (jnp.real(lo) == jnp.real(hi))
    out = jnp.where(same_inf, hi, jnp.log1p(jnp.exp(lo - hi)) + hi)
    return jnp.where(nan, jnp.asarray(complex(jnp.nan, jnp.nan), out.dtype), out)


def _cumulative_extreme(x, dim, later_wins):
    """(values, indices) of a running max/min. NaN beats everything; among equal values the
    later index wins, as on CPU."""
    if x.ndim == 0:
        return x, jnp.zeros((), INDEX)
    axis = _axis(x, dim)
    index = lax.broadcasted_iota(INDEX, x.shape, axis)
    floating = jnp.issubdtype(x.dtype, jnp.inexact)

    def combine(a, b):
        (va, ia), (vb, ib) = a, b
        take_b = later_wins(vb, va)
        if floating:
            take_b = jnp.isnan(vb) | (~jnp.isnan(va) & take_b)
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    return lax.associative_scan(combine, (x, index), axis=axis)


@lowers(aten.cummax.default)
def cummax(self, dim):
    return _cumulative_extreme(self, dim, lambda b, a: b >= a)


@lowers(aten.cummin.default)
def cummin(self, dim):
    return _cumulative_extreme(self, dim, lambda b, a: b <= a)


# ------------------------------------------------------------------ sorting
def _sort_key(x):
    """Values as PyTorch orders them: -0.0 equals 0.0 and every NaN is one NaN above +inf
    (XLA's total order would split them)."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x
    x = jnp.where(x == 0, jnp.zeros((), x.dtype), x)
    return jnp.where(jnp.isnan(x), jnp.full((), jnp.nan, x.dtype), x)


def _stable_order(x, axis, descending):
    return jnp.argsort(_sort_key(x), axis=axis, stable=True, descending=descending).astype(INDEX)


@lowers(aten.sort.stable)
def sort(self, *, stable, dim=-1, descending=False):
    # Always stable: an unstable sort may order ties any way, and stable is one such way.
    if self.ndim == 0:
        return self, jnp.zeros((), INDEX)
    axis = _axis(self, dim)
    index = _stable_order(self, axis, descending)
    return jnp.take_along_axis(self, index, axis), index


@lowers(aten.sort.default)
def sort_default(self, dim=-1, descending=False):
    # The overload without `stable` (torch.sort in graphs): a stable sort is one valid order.
    return sort(self, stable=True, dim=dim, descending=descending)


@lowers(aten.topk.default)
def topk(self, k, dim=-1, largest=True, sorted=True):
    # A full stable sort: its first k are sorted (which sorted=False also allows).
    if self.ndim == 0:
        return self, jnp.zeros((), INDEX)
    axis = _axis(self, dim)
    index = lax.slice_in_dim(_stable_order(self, axis, largest), 0, k, axis=axis)
    return jnp.take_along_axis(self, index, axis), index


# ------------------------------------------------------------------ order statistics
def _nan_count(x):
    """NaNs along the last axis, kept as a size-1 axis."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.zeros(x.shape[:-1] + (1,), INDEX)
    return jnp.sum(jnp.isnan(x), -1, keepdims=True, dtype=INDEX)


def _rank_along(x, dim, keepdim, rank):
    """(values, indices) of the element of sorted rank `rank(n, nan_count)` along `dim`, in the
    stable ascending order (NaN last, so ties keep the earlier index first)."""
    if x.ndim == 0:
        return x, jnp.zeros((), INDEX)
    axis = _axis(x, dim)
    order = jnp.moveaxis(_stable_order(x, axis, False), axis, -1)
    k = rank(x.shape[axis], _nan_count(jnp.moveaxis(x, axis, -1)))
    index = jnp.take_along_axis(order, k, -1)
    values = jnp.take_along_axis(jnp.moveaxis(x, axis, -1), index, -1)
    values, index = jnp.moveaxis(values, -1, axis), jnp.moveaxis(index, -1, axis)
    if not keepdim:
        values, index = jnp.squeeze(values, axis), jnp.squeeze(index, axis)
    return values, index


def _median_rank(n, nans):
    return jnp.where(nans > 0, n - nans, (n - 1) // 2)  # any NaN: the first NaN


def _nanmedian_rank(n, nans):
    # An all-NaN row gives NaN; its index is the first NaN's (CPU's depends on its partial sort).
    return jnp.maximum(n - nans - 1, 0) // 2


# The median of no elements is CPU's NaN converted to the dtype (as x86 converts it: the
# integer indefinite value for 32- and 64-bit integers, 2**63 for uint64, zero where the
# conversion goes through a wider integer, True for bool).
_EMPTY_MEDIAN = {jnp.dtype(jnp.int32): -2**31, jnp.dtype(jnp.int64): -2**63, jnp.dtype(jnp.uint64): 2**63,
                 jnp.dtype(jnp.bool_): True}


def _empty_median(dtype):
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.full((), jnp.nan, dtype)
    return jnp.full((), _EMPTY_MEDIAN.get(jnp.dtype(dtype), 0), dtype)


@lowers(aten.median.default)
def median(self):
    if self.size == 0:
        return _empty_median(self.dtype)
    return _rank_along(self.reshape(-1), 0, False, _median_rank)[0]


@lowers(aten.median.dim)
def median_dim(self, dim, keepdim=False):
    return _rank_along(self, dim, keepdim, _median_rank)


@lowers(aten.nanmedian.default)
def nanmedian(self):
    if self.size == 0:
        return _empty_median(self.dtype)
    return _rank_along(self.reshape(-1), 0, False, _nanmedian_rank)[0]


@lowers(aten.nanmedian.dim)
def nanmedian_dim(self, dim, keepdim=False):
    return _rank_along(self, dim, keepdim, _nanmedian_rank)


@lowers(aten.kthvalue.default)
def kthvalue(self, k, dim=-1, keepdim=False):
    return _rank_along(self, dim, keepdim, lambda n, nans: jnp.full(nans.shape, k - 1, INDEX))


@lowers(aten.mode.default)
def mode(self, dim=-1, keepdim=False):
    """The most frequent value (the smallest among equally frequent ones) and the index of its
    last occurrence, as PyTorch's CPU kernel returns."""
    if self.ndim == 0:
        return self, jnp.zeros((), INDEX)
    axis = _axis(self, dim)
    x = jnp.moveaxis(self, axis, -1)
    order = jnp.moveaxis(_stable_order(self, axis, False), axis, -1)
    s = _sort_key(jnp.take_along_axis(x, order, -1))
    same = (s[..., :, None] == s[..., None, :])
    if jnp.issubdtype(s.dtype, jnp.floating):
        same = same | (jnp.isnan(s[..., :, None]) & jnp.isnan(s[..., None, :]))
    counts = jnp.sum(same, -1)
    first = jnp.argmax(counts, -1, keepdims=True)  # the first position of the smallest winner
    last = first + jnp.take_along_axis(counts, first, -1) - 1
    index = jnp.take_along_axis(order, last, -1)
    values = jnp.take_along_axis(x, index, -1)
    values, index = jnp.moveaxis(values, -1, axis), jnp.moveaxis(index, -1, axis)
    if not keepdim:
        values, index = jnp.squeeze(values, axis), jnp.squeeze(index, axis)
    return values, index


# ------------------------------------------------------------------ binary search
def _search(sequence, values, right, side, sorter, out_int32):
    if side is not None:
        right = side == "right"
    if sorter is not None:
        sequence = jnp.take_along_axis(sequence, sorter, -1)
    dtype = jnp.promote_types(sequence.dtype, values.dtype)
    sequence, values = sequence.astype(dtype), values.astype(dtype)
    find = lambda seq, v: jnp.searchsorted(seq, v, side="right" if right else "left")
    if sequence.ndim <= 1:
        out = find(sequence, values)
    else:  # one sorted row per leading index of the values
        lead = sequence.shape[:-1]
        out = jax.vmap(find)(sequence.reshape(-1, sequence.shape[-1]), values.reshape((-1,) + values.shape[-1:]))
        out = out.reshape(lead + values.shape[-1:])
    return out.astype(jnp.int32 if out_int32 else INDEX)


@lowers(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(self, boundaries, *, out_int32=False, right=False):
    return _search(boundaries, jnp.asarray(self), right, None, None, out_int32)


@lowers(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    return _search(sorted_sequence, jnp.asarray(self), right, side, sorter, out_int32)


@lowers(aten.trace.default)
def trace(self):
    # integer traces sum in int64, as torch.sum does
    dtype = jnp.int64 if jnp.issubdtype(self.dtype, jnp.integer) or self.dtype == jnp.bool_ else self.dtype
    return jnp.trace(self).astype(dtype)


@lowers(aten.renorm.default)
def renorm(self, p, dim, maxnorm):
    """Each slice along `dim` whose p-norm exceeds maxnorm is scaled down to norm maxnorm."""
    axes = tuple(d for d in range(self.ndim) if d != dim % self.ndim)
    x = opmath(self)
    p = jnp.asarray(p, x.dtype)
    norm = jnp.where(p == jnp.inf, jnp.max(jnp.abs(x), axis=axes, keepdims=True),
                     jnp.sum(jnp.abs(x) ** p, axis=axes, keepdims=True) ** (1 / p))
    factor = jnp.where(norm > maxnorm, maxnorm / (norm + 1e-7), 1.0)
    return (x * factor).astype(self.dtype)


@lowers(aten.hash_tensor.default)
def hash_tensor(self, dim=(), *, keepdim=False, mode=0):
    """XOR of the elements' bits, as CPU computes it: floats widened to float64, integers and
    bools to int64, each read as uint64."""
    wide = self.astype(jnp.float64) if jnp.issubdtype(self.dtype, jnp.floating) else self.astype(jnp.int64)
    bits = lax.bitcast_convert_type(wide, jnp.uint64)
    dim = [dim] if isinstance(dim, int) else list(dim)
    axes = tuple(range(self.ndim)) if not dim else tuple(d % self.ndim for d in dim) if self.ndim else ()
    out = lax.reduce(bits, jnp.uint64(0), lax.bitwise_xor, axes)
    return jnp.expand_dims(out, axes) if keepdim else out


# segment_reduce: reduce runs of rows along `axis`; lengths (or offsets) have shape
# data.shape[:axis] + (segments,), so the leading dimensions map over the 1-D case.
def _segment_1d(data, lengths, reduce, initial):
    segments = lengths.shape[0]
    ends = jnp.cumsum(lengths)
    ids = jnp.searchsorted(ends, jnp.arange(data.shape[0]), side="right")  # past the end: dropped
    ops = {"sum": jax.ops.segment_sum, "mean": jax.ops.segment_sum, "prod": _segment_prod,
           "max": jax.ops.segment_max, "min": jax.ops.segment_min}
    out = ops[reduce](data, ids, segments)
    shape = (segments,) + (1,) * (data.ndim - 1)
    count = jax.ops.segment_sum(jnp.ones_like(ids, data.dtype), ids, segments).reshape(shape)
    if initial is not None:
        init = jnp.asarray(initial, data.dtype)
        out = {"sum": out + init, "mean": out + init, "prod": out * init,
               "max": jnp.maximum(out, init), "min": jnp.minimum(out, init)}[reduce]
    if reduce == "mean":
        out = out / count if initial is None else jnp.where(count > 0, out / jnp.maximum(count, 1), init)
    return out


def _segment_prod(data, ids, segments):
    # A mask over (segments, rows) rather than scatter-multiply: JAX differentiates this one.
    member = (ids[None, :] == jnp.arange(segments)[:, None]).reshape((segments, -1) + (1,) * (data.ndim - 1))
    return jnp.prod(jnp.where(member, data[None], jnp.ones((), data.dtype)), axis=1)


def _segment(data, reduce, lengths, axis, initial):
    fn = lambda d, n: _segment_1d(d, n, reduce, initial)
    for _ in range(axis):
        fn = jax.vmap(fn)
    return fn(data, lengths)


def _lengths(lengths, offsets):
    return lengths if lengths is not None else jnp.diff(offsets, axis=-1)


@lowers(aten.segment_reduce.default, static_scalars=True)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False,
                   initial=None):
    return _segment(data, reduce, _lengths(lengths, offsets), axis % data.ndim, initial)


@lowers(aten._segment_reduce_backward.default, static_scalars=True)
def segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    _, pull = jax.vjp(lambda d: _segment(d, reduce, _lengths(lengths, offsets), axis % data.ndim, initial), data)
    return pull(grad.astype(data.dtype))[0]


# ------------------------------------------------------------------ padding rules
# How each op stays exact on operands padded along a growing axis (padding.py).
@pads(aten.sum.dim_IntList, aten.sum.default)
def _sum_padding(call):
    return Padding(fills=(Fill("self", reduced_axes(call), False if call["self"].dtype is torch.bool else 0),))


@pads(aten.prod.dim_int, aten.prod.default)
def _prod_padding(call):
    return Padding(fills=(Fill("self", reduced_axes(call), True if call["self"].dtype is torch.bool else 1),))


@pads(aten.amax.default, aten.max.dim, aten.max.default)
def _max_padding(call):
    return Padding(fills=(Fill("self", reduced_axes(call), lowest(call["self"].dtype)),))


@pads(aten.amin.default, aten.min.dim, aten.min.default)
def _min_padding(call):
    return Padding(fills=(Fill("self", reduced_axes(call), highest(call["self"].dtype)),))


def _flat_index(call):
    """argmax/argmin without a dim index the flattened tensor: padding moves every row after the first."""
    return call["dim"] is None and call["self"].ndim > 1


@pads(aten.argmax.default)
def _argmax_padding(call):
    return None if _flat_index(call) else _max_padding(call)


@pads(aten.argmin.default)
def _argmin_padding(call):
    return None if _flat_index(call) else _min_padding(call)


@pads(aten.linalg_vector_norm.default)
def _vector_norm_padding(call):
    if call["ord"] < 0:
        return None  # 0 ** negative order is inf
    return Padding(fills=(Fill("self", reduced_axes(call), 0),))


def _masked_moments(x, valid, dims, correction):
    """(mean, variance with `correction`) of `x` over `dims`, counting only `valid` positions."""
    valid = jnp.broadcast_to(valid, x.shape)
    count = jnp.sum(valid, axis=dims, keepdims=True)
    mean = jnp.sum(jnp.where(valid, x, 0), axis=dims, keepdims=True) / count
    if correction is None:
        return mean, None
    centred = jnp.where(valid, x - mean, 0)
    # degrees of freedom clamped at 0, as PyTorch does (inf, or nan for a zero sum)
    return mean, jnp.sum(centred * jnp.conj(centred), axis=dims, keepdims=True).real / jnp.maximum(count - correction, 0)


def _reduced(value, dims, keepdim):
    return value if keepdim else jnp.squeeze(value, axis=dims)


@pads(aten.mean.dim, aten.mean.default)
def _mean_padding(call):
    dims = reduced_axes(call)

    def masked(c, valid):
        x = wide(c["self"] if c.get("dtype") is None else c["self"].astype(to_jax(c["dtype"])))
        return _reduced(_masked_moments(x, valid, dims, None)[0], dims, c.get("keepdim", False))

    return Padding(masked=masked, counted_axes=dims)


def _correction(c):
    return 1 if c["correction"] is None else c["correction"]


def _moments_padding(finish):
    """The rule of var/std/var_mean: `finish(mean, variance)` of the true positions."""
    def rule(call):
        dims = reduced_axes(call)

        def masked(c, valid):
            mean, variance = _masked_moments(wide(c["self"]), valid, dims, _correction(c))
            return finish(_reduced(mean, dims, c["keepdim"]), _reduced(variance, dims, c["keepdim"]))

        return Padding(masked=masked, counted_axes=dims)
    return rule


pads(aten.var.correction)(_moments_padding(lambda mean, variance: variance))
pads(aten.std.correction)(_moments_padding(lambda mean, variance: jnp.sqrt(variance)))
pads(aten.var_mean.correction)(_moments_padding(lambda mean, variance: (variance, mean)))


@pads(aten.logsumexp.default)
def _logsumexp_padding(call):
    """exp(-inf) = 0: a padded position adds nothing to the sum."""
    if not call["self"].dtype.is_floating_point:
        return None
    return Padding(fills=(Fill("self", reduced_axes(call), -math.inf),))
