"""Lowerings: random sampling. Each takes `key=`, a PRNG key from the device generator.

rand/randn/randint/*_like decompose above us into empty + uniform_/normal_/random_, whose
functional forms are lowered here. Samples are drawn in the tensor's floating dtype (or in
float32 for integral/bool tensors) and cast to it by the driver.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..runtime.dtypes import to_jax
from . import aten, functional_of, lowers


def _float(dtype):
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32


def _uniform(key, shape, dtype):
    return jax.random.uniform(key, shape, _float(dtype))


def _open_uniform(key, shape, dtype):
    """Uniform on (0, 1]: safe under log()."""
    return 1 - _uniform(key, shape, dtype)


@lowers(aten.uniform.default, random=True)
def uniform(self, from_=0.0, to=1.0, *, generator=None, key):
    low, high = jnp.asarray(from_, _float(self.dtype)), jnp.asarray(to, _float(self.dtype))
    return low + (high - low) * _uniform(key, self.shape, self.dtype)


def _normal(key, shape, dtype, mean, std):
    dtype = _float(dtype)
    return mean + std * jax.random.normal(key, shape, dtype)


@lowers(aten.normal_functional.default, random=True)
def normal_functional(self, mean=0.0, std=1.0, *, generator=None, key):
    return _normal(key, self.shape, self.dtype, mean, std)


functional_of(aten.normal_.default, aten.normal_functional.default)


@lowers(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor, random=True)
def normal(mean, std=1.0, *, generator=None, key):
    arrays = [v for v in (mean, std) if isinstance(v, jax.Array)]
    shape = jnp.broadcast_shapes(*(a.shape for a in arrays))
    dtype = jnp.result_type(*arrays)
    return _normal(key, shape, dtype, jnp.asarray(mean, dtype), jnp.asarray(std, dtype))


@lowers(aten.normal.float_float, random=True)
def normal_float_float(mean, std, size, *, generator=None, dtype=None, layout=None, device=None,
                       pin_memory=None, key):
    return _normal(key, tuple(size), to_jax(dtype or torch.get_default_dtype()), mean, std)


@lowers(aten.bernoulli.default, random=True)
def bernoulli(self, *, generator=None, key):
    # self holds the probabilities
    return _uniform(key, self.shape, self.dtype) < self.astype(_float(self.dtype))


@lowers(aten.bernoulli.p, aten.bernoulli.Tensor, random=True)
def bernoulli_p(self, p=0.5, *, generator=None, key):  # bernoulli_.float defaults p
    return _uniform(key, self.shape, self.dtype) < jnp.asarray(p, _float(self.dtype))


functional_of(aten.bernoulli_.float, aten.bernoulli.p)


def _bounds(dtype) -> tuple[int, int]:
    """random_()'s inclusive default range: every integer the dtype represents exactly, from 0."""
    if dtype == jnp.bool_:
        return 0, 1
    if jnp.issubdtype(dtype, jnp.floating):
        return 0, 2 ** (jnp.finfo(dtype).nmant + 1)
    return 0, int(jnp.iinfo(dtype).max)


def _integers(key, shape, low: int, high: int):
    """Uniform integers in [low, high] (inclusive), as int64."""
    span = high - low + 1
    if span >= 2 ** 63:  # beyond randint's int64 bounds: take raw bits
        return (jax.random.bits(key, shape, jnp.uint64) >> 1).astype(jnp.int64) + low
    return jax.random.randint(key, shape, low, low + span, jnp.int64)


@lowers(aten.random.default, random=True)
def random(self, *, generator=None, key):
    return _integers(key, self.shape, *_bounds(self.dtype))


@lowers(getattr(aten.random, "from"), aten.random.to, random=True)  # aten.random.from: "from" is a keyword
def random_range(self, *args, generator=None, key):
    low, high = (0, args[0]) if len(args) == 1 else args
    # to=None means up to the dtype's default bound
    high = _bounds(self.dtype)[1] if high is None else high - 1
    return _integers(key, self.shape, low, high)


@lowers(aten.exponential.default, random=True)
def exponential(self, lambd=1.0, *, generator=None, key):
    return -jnp.log(_open_uniform(key, self.shape, self.dtype)) / lambd


@lowers(aten.geometric.default, random=True)
def geometric(self, p, *, generator=None, key):
    # trials up to and including the first success
    u = _open_uniform(key, self.shape, jnp.float64)
    return jnp.ceil(jnp.log(u) / np.log1p(-p)).clip(1)


@lowers(aten.log_normal.default, random=True)
def log_normal(self, mean=1.0, std=2.0, *, generator=None, key):
    return jnp.exp(_normal(key, self.shape, self.dtype, mean, std))


@lowers(aten.cauchy.default, random=True)
def cauchy(self, median=0.0, sigma=1.0, *, generator=None, key):
    u = _uniform(key, self.shape, self.dtype)
    return median + sigma * jnp.tan(np.pi * (u - 0.5))


@lowers(aten.multinomial.default, random=True)
def multinomial(self, num_samples, replacement=False, *, generator=None, key):
    logits = jnp.log(self.astype(jnp.float64))
    if replacement:
        draws = jax.random.categorical(key, logits, axis=-1, shape=(num_samples, *self.shape[:-1]))
        return jnp.moveaxis(draws, 0, -1)
    # Without replacement: the top-k of Gumbel-perturbed logits is a draw of k distinct classes.
    perturbed = logits + jax.random.gumbel(key, self.shape, jnp.float64)
    return jax.lax.top_k(perturbed, num_samples)[1]


@lowers(aten.randperm.default, aten.randperm.generator, random=True)
def randperm(n, *, generator=None, dtype=torch.int64, layout=None, device=None, pin_memory=None, key):
    return jax.random.permutation(key, n)
