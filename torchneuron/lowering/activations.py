"""Lowerings: activations (ReLU, GELU, SiLU, the hard and shrink ones, ELU, softplus, log-sigmoid,
GLU, PReLU, RReLU) and their backwards, channel shuffle, margin losses and pairwise distances (cdist).

Backward ops are jax.vjp of the forward where PyTorch's gradient is the plain derivative; cdist
and PReLU spell out PyTorch's own conventions (zero subgradient at distance 0, unreduced weight
gradient).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from . import DEFAULT, aten, functional_of, lowers, opmath
from .elementwise import SELF, _clamp_max, _clamp_min, _const
from .nn import _MEAN, _reduce

GRAD_SELF = ("grad_output", "self")


# ------------------------------------------------------------ activations
# promote=DEFAULT on self alone: half types compute in float32 like PyTorch's CPU kernels, and
# the Scalar parameters arrive in that dtype.
def activation(*ops):
    return lowers(*ops, promote=DEFAULT, promote_args=SELF)


def backward(*ops, args=GRAD_SELF):
    return lowers(*ops, promote=DEFAULT, promote_args=args)


@activation(aten.relu.default)
def relu(self):
    return jnp.maximum(self, jnp.zeros_like(self))


@activation(aten.threshold.default)
def threshold(self, threshold, value):
    return jnp.where(self <= threshold, value, self)


@backward(aten.threshold_backward.default)
def threshold_backward(grad_output, self, threshold):
    return jnp.where(self <= threshold, jnp.zeros_like(grad_output), grad_output)


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_GELU_KAPPA = 0.044715


@activation(aten.gelu.default)
def gelu(self, *, approximate="none"):
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (self + _GELU_KAPPA * self * self * self)
        return 0.5 * self * (1 + jnp.tanh(inner))
    return 0.5 * self * (1 + lax.erf(self * math.sqrt(0.5)))


@backward(aten.gelu_backward.default)
def gelu_backward(grad_output, self, *, approximate="none"):
    x = self
    if approximate == "tanh":
        x_sq = x * x
        tanh_inner = jnp.tanh(_SQRT_2_OVER_PI * (x + _GELU_KAPPA * x_sq * x))
        left = 0.5 * x
        left_derivative = 0.5 * (1 + tanh_inner)
        right_derivative = left * (1 - tanh_inner * tanh_inner) * _SQRT_2_OVER_PI * (1 + 3 * _GELU_KAPPA * x_sq)
        return grad_output * (left_derivative + right_derivative)
    cdf = 0.5 * (1 + lax.erf(x * math.sqrt(0.5)))
    pdf = jnp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return grad_output * (cdf + x * pdf)


@activation(aten.silu.default)
def silu(self):
    return self / (1 + jnp.exp(-self))


@activation(aten.mish.default)
def mish(self):
    return self * jnp.tanh(jnp.log1p(jnp.exp(self)))


@backward(aten.sigmoid_backward.default, args=("grad_output", "output"))
def sigmoid_backward(grad_output, output):
    return grad_output * jnp.conj((1 - output) * output)


@backward(aten.tanh_backward.default, args=("grad_output", "output"))
def tanh_backward(grad_output, output):
    return grad_output * jnp.conj(1 - output * output)


@activation(aten.hardtanh.default)
def hardtanh(self, min_val=-1, max_val=1):
    return _clamp_max(_clamp_min(self, min_val), max_val)


@backward(aten.hardtanh_backward.default)
def hardtanh_backward(grad_output, self, min_val, max_val):
    return jnp.where((self <= min_val) | (self >= max_val), jnp.zeros_like(grad_output), grad_output)


def _relu6(x):
    return jnp.minimum(jnp.maximum(x, 0), 6)


@activation(aten.hardsigmoid.default)
def hardsigmoid(self):
    return _relu6(self + 3) / 6


@backward(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad_output, self):
    return jnp.where((self > -3) & (self < 3), grad_output / 6, jnp.zeros_like(grad_output))


@activation(aten.hardswish.default)
def hardswish(self):
    return self * _relu6(self + 3) / 6


@backward(aten.hardswish_backward.default)
def hardswish_backward(grad_output, self):
    inside = grad_output * (self / 3 + 0.5)
    return jnp.where(self <= -3, jnp.zeros_like(grad_output), jnp.where(self < 3, inside, grad_output))


@activation(aten.leaky_relu.default)
def leaky_relu(self, negative_slope=0.01):
    return jnp.where(self > 0, self, self * negative_slope)


@backward(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    return jnp.where(self > 0, grad_output, grad_output * negative_slope)


@activation(aten.elu.default)
def elu(self, alpha=1, scale=1, input_scale=1):
    return jnp.where(self > 0, self * scale, jnp.expm1(self * input_scale) * (alpha * scale))


@backward(aten.elu_backward.default, args=("grad_output", "self_or_result"))
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    x = self_or_result
    if is_result:  # x is elu's output: exp(x_in * input_scale) = x / (alpha * scale) + 1
        negative = grad_output * input_scale * (x + alpha * scale)
    else:
        negative = grad_output * input_scale * (alpha * scale) * jnp.exp(x * input_scale)
    return jnp.where(x <= 0, negative, grad_output * scale)


@activation(aten.celu.default)
def celu(self, alpha=1.0):
    return jnp.where(self > 0, self, jnp.expm1(self / alpha) * alpha)


@activation(aten.softplus.default)
def softplus(self, beta=1, threshold=20):
    scaled = self * beta
    return jnp.where(scaled > threshold, self, jnp.log1p(jnp.exp(scaled)) / beta)


@backward(aten.softplus_backward.default)
def softplus_backward(grad_output, self, beta, threshold):
    z = jnp.exp(self * beta)
    return jnp.where(self * beta > threshold, grad_output, grad_output * z / (z + 1))


@backward(aten.logit_backward.default)
def logit_backward(grad_output, self, eps=None):
    derivative = grad_output / (self * (1 - self))
    if eps is None:
        outside, fill = (self < 0) | (self > 1), jnp.nan
    else:
        outside, fill = (self < eps) | (self > 1 - eps), 0
    return jnp.where(outside, _const(fill, derivative), derivative)


@activation(aten.softshrink.default)
def softshrink(self, lambd=0.5):
    return jnp.where(self > lambd, self - lambd, jnp.where(self < -lambd, self + lambd, self * 0))


@activation(aten.hardshrink.default)
def hardshrink(self, lambd=0.5):
    return jnp.where((self >= -lambd) & (self <= lambd), jnp.zeros_like(self), self)


def _shrink_backward(grad, self, lambd):
    return jnp.where((self >= -lambd) & (self <= lambd), jnp.zeros_like(grad), grad)


@backward(aten.softshrink_backward.default)
def softshrink_backward(grad_output, self, lambd):
    return _shrink_backward(grad_output, self, lambd)


@backward(aten.hardshrink_backward.default, args=("grad_out", "self"))
def hardshrink_backward(grad_out, self, lambd):
    return _shrink_backward(grad_out, self, lambd)


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


functional_of(aten.rrelu_with_noise_.default, aten.rrelu_with_noise_functional.default)  # writes self and noise


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
