"""Lowerings: less common activations (log-sigmoid, GLU, PReLU, RReLU), channel shuffle, margin
losses and pairwise distances (cdist).

Backward ops are jax.vjp of the forward where PyTorch's gradient is the plain derivative; cdist
and PReLU spell out PyTorch's own conventions (zero subgradient at distance 0, unreduced weight
gradient).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from . import aten, lowers, opmath
from .nn import _MEAN, _reduce


# ------------------------------------------------------------------- more activations
@lowers(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(self):
    x = opmath(self)
    buffer = jnp.exp(-jnp.abs(x))  # what PyTorch's CPU kernel keeps for the backward
    return (jnp.minimum(x, 0) - jnp.log1p(buffer)).astype(self.dtype), buffer.astype(self.dtype)


@lowers(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad_output, self, buffer):
    return (opmath(grad_output) * jax.nn.sigmoid(-opmath(self))).astype(self.dtype)


def _glu(x, dim):
    a, b = jnp.split(opmath(x), 2, axis=dim)
    return (a * jax.nn.sigmoid(b)).astype(x.dtype)


@lowers(aten.glu.default)
def glu(self, dim=-1):
    return _glu(self, dim)


@lowers(aten.glu_backward.default)
def glu_backward(grad_output, self, dim):
    _, vjp = jax.vjp(lambda x: _glu(x, dim), self)
    return vjp(grad_output)[0]


@lowers(aten.glu_jvp.default)
def glu_jvp(glu, x, dx, dim):
    """The forward-mode tangent of glu(x) = a * sigmoid(b) along dx = (da, db), written as CPU's
    kernel computes it: da * sigmoid(b) + glu * (db - sigmoid(b) * db)."""
    _, b = jnp.split(opmath(x), 2, axis=dim)
    da, db = jnp.split(opmath(dx), 2, axis=dim)
    sig_b = jax.nn.sigmoid(b)
    return (da * sig_b + opmath(glu) * (db - sig_b * db)).astype(glu.dtype)


def _prelu(x, w):
    return jnp.where(x > 0, x, w * x).astype(x.dtype)


@lowers(aten._prelu_kernel.default)
def prelu_kernel(self, weight):
    return _prelu(self, weight)


@lowers(aten._prelu_kernel_backward.default)
def prelu_kernel_backward(grad_output, self, weight):
    # Both gradients have the broadcast shape: autograd sums the weight's down to its shape.
    x, w, g = opmath(self), opmath(weight), opmath(grad_output)
    shape = jnp.broadcast_shapes(x.shape, w.shape)
    grad_self = jnp.broadcast_to(jnp.where(x > 0, g, w * g), shape).astype(self.dtype)
    grad_weight = jnp.broadcast_to(jnp.where(x > 0, 0, x * g), shape).astype(weight.dtype)
    return grad_self, grad_weight


@lowers(aten.channel_shuffle.default, aten.native_channel_shuffle.default)
def channel_shuffle(self, groups):
    n, c = self.shape[:2]
    x = self.reshape((n, groups, c // groups) + self.shape[2:])
    return jnp.swapaxes(x, 1, 2).reshape(self.shape)


@lowers(aten.rrelu_with_noise_functional.default, random=True)
def rrelu_with_noise_functional(self, noise, lower=0.125, upper=1 / 3, training=False, generator=None, *, key):
    x = opmath(self)
    if not training:
        slope = (lower + upper) / 2
        return jnp.where(x >= 0, x, x * slope).astype(self.dtype), noise
    r = jax.random.uniform(key, x.shape, x.dtype) * (upper - lower) + lower
    scale = jnp.where(x <= 0, r, jnp.ones((), x.dtype))
    return (x * scale).astype(self.dtype), scale.astype(noise.dtype)


@lowers(aten.rrelu_with_noise_backward.default)
def rrelu_with_noise_backward(grad_output, self, noise, lower, upper, training, self_is_result):
    g = opmath(grad_output)
    slope = (lower + upper) / 2
    fixed = jnp.where(opmath(self) > 0, g, g * slope)
    if not training:
        return fixed.astype(grad_output.dtype)
    # lower and upper are traced: the choice between noise and a fixed slope is a select
    return jnp.where(upper - lower > 1e-6, g * opmath(noise), fixed).astype(grad_output.dtype)


# ------------------------------------------------------------------- margin losses
def _multi_margin(x, target, p, margin, weight, reduction):
    xu = opmath(x)
    xs = xu.reshape(-1, x.shape[-1] if x.ndim else 1)
    t = target.reshape(-1)
    picked = jnp.take_along_axis(xs, t[:, None], 1)
    z = jnp.maximum(margin - picked + xs, 0)
    z = jnp.where(p == 1, z, z * z)
    if weight is not None:
        z = z * opmath(weight)[t][:, None]
    z = jnp.where(jnp.arange(xs.shape[1])[None, :] == t[:, None], 0, z)
    loss = jnp.sum(z, 1) / xs.shape[1]
    loss = loss if xu.ndim == 2 else loss.reshape(())
    return _reduce(loss, reduction).astype(x.dtype)


@lowers(aten.multi_margin_loss.default)
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=_MEAN):
    return _multi_margin(self, target, p, margin, weight, reduction)


@lowers(aten.multi_margin_loss_backward.default)
def multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=_MEAN):
    _, vjp = jax.vjp(lambda x: _multi_margin(x, target, p, margin, weight, reduction), self)
    return vjp(grad_output)[0]


def _multilabel_targets(target, classes):
    """(rows, classes) float mask of each row's target classes: those before its first -1."""
    t = target.reshape(-1, classes)
    valid = jnp.cumprod(t >= 0, axis=1).astype(jnp.bool_)
    hit = (t[:, :, None] == jnp.arange(classes)[None, None, :]) & valid[:, :, None]
    return jnp.any(hit, axis=1), jnp.clip(t, 0, classes - 1), valid


def _multilabel_margin(x, target, reduction):
    xu = opmath(x)
    classes = x.shape[-1] if x.ndim else 1
    xs = xu.reshape(-1, classes)
    is_target, t, valid = _multilabel_targets(target, classes)
    picked = jnp.take_along_axis(xs, t, 1)  # (rows, targets)
    z = jnp.maximum(1 - (picked[:, :, None] - xs[:, None, :]), 0)  # (rows, targets, classes)
    z = jnp.where(valid[:, :, None] & ~is_target[:, None, :], z, 0)
    loss = jnp.sum(z, (1, 2)) / classes
    loss = loss.reshape(x.shape[:-1]) if x.ndim == 2 else loss.reshape(())
    return _reduce(loss, reduction).astype(x.dtype), is_target.reshape(target.shape).astype(x.dtype)


@lowers(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(self, target, reduction):
    return _multilabel_margin(self, target, reduction)


@lowers(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    _, vjp = jax.vjp(lambda x: _multilabel_margin(x, target, reduction)[0], self)
    return vjp(grad_output)[0]


# ------------------------------------------------------------------- pairwise distances
def _use_matmul(x1, x2, p, compute_mode):
    if p != 2:
        return False
    if compute_mode is None or compute_mode == 0:
        return x1.shape[-2] > 25 or x2.shape[-2] > 25
    return compute_mode == 1


@lowers(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode=None):
    a, b = opmath(x1), opmath(x2)
    if _use_matmul(x1, x2, p, compute_mode):
        sq = jnp.sum(a * a, -1)[..., :, None] + jnp.sum(b * b, -1)[..., None, :] - 2 * (a @ jnp.swapaxes(b, -1, -2))
        return jnp.sqrt(jnp.maximum(sq, 0)).astype(x1.dtype)
    d = jnp.abs(a[..., :, None, :] - b[..., None, :, :])
    if p == 0:
        out = jnp.sum(d != 0, -1).astype(a.dtype)
    elif p == math.inf:
        out = jnp.max(d, -1, initial=0)
    elif p == 1:
        out = jnp.sum(d, -1)
    elif p == 2:
        out = jnp.sqrt(jnp.sum(d * d, -1))
    else:
        out = jnp.sum(d ** p, -1) ** (1 / p)
    return out.astype(x1.dtype)


@lowers(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p, cdist):
    # d dist_ij / d x1_i: 0 where the distance is 0 (PyTorch's subgradient choice)
    a, b, g, dist = opmath(x1), opmath(x2), opmath(grad)[..., None], opmath(cdist)[..., None]
    diff = a[..., :, None, :] - b[..., None, :, :]
    zero = jnp.zeros((), a.dtype)
    safe = jnp.where(dist == 0, 1, dist)
    if p == 0:
        part = jnp.zeros_like(diff)
    elif p == 1:
        part = jnp.sign(diff) * g
    elif p == 2:
        part = diff * g / safe
    elif p == math.inf:
        part = jnp.sign(diff) * (jnp.abs(diff) == dist) * g
    else:
        part = jnp.sign(diff) * jnp.abs(diff) ** (p - 1) * g / safe ** (p - 1)
        if p < 1:
            part = jnp.where(diff == 0, zero, part)
    part = jnp.where(dist == 0, zero, part)
    return jnp.sum(part, -2).astype(x1.dtype)


# pdist: the upper triangle (i < j, row-major) of the rows' pairwise p-distances, which is
# cdist of the rows with themselves (direct differences, never the matmul form).
def _upper_pairs(n):
    return jnp.triu_indices(n, k=1)


@lowers(aten._pdist_forward.default)
def pdist_forward(self, p=2.0):
    i, j = _upper_pairs(self.shape[0])
    return cdist_forward(self, self, p, 2)[i, j]


@lowers(aten._pdist_backward.default)
def pdist_backward(grad, self, p, pdist):
    n = self.shape[0]
    i, j = _upper_pairs(n)
    full = jnp.zeros((n, n), grad.dtype).at[i, j].set(grad)
    dist = jnp.zeros((n, n), pdist.dtype).at[i, j].set(pdist)
    # each pair's distance depends on both rows: the (i, j) and (j, i) terms of cdist's gradient
    return cdist_backward(full + full.T, self, self, p, dist + dist.T)
