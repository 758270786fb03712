"""Lowerings: neural-network ops (convolution, normalization, softmax, losses, embedding, dropout).

Half-precision inputs compute in float32 and round once at the end, as PyTorch's CPU kernels
do with their "opmath" type. Backward ops whose math is the gradient of a forward here use
jax.vjp of that forward, so forward and backward cannot drift apart.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from . import aten, lowers, opmath, opmath_dtype, out_from_functional, overrides_meta, redirected
from .asserts import check_index, device_assert
from .padding import POSITION_WISE, Fill, Padding, all_axes, pads, reduced_axes, wide
from .reductions import _vector_norm

_NONE, _MEAN, _SUM = 0, 1, 2  # at::Reduction


def _bcast_channel(v, ndim):
    """A per-channel vector shaped to broadcast against an (N, C, *) tensor."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _reduce(loss, reduction):
    if reduction == _MEAN:
        return jnp.mean(loss)
    if reduction == _SUM:
        return jnp.sum(loss)
    return loss


def _grad_of_reduction(grad_output, shape, reduction):
    """grad_output spread back over the elements `reduction` combined."""
    if reduction == _MEAN:
        return jnp.broadcast_to(grad_output / math.prod(shape), shape)
    return jnp.broadcast_to(grad_output, shape)


# ----------------------------------------------------------------------------- convolution
def _per_axis(param, spatial):
    """A convolution parameter per spatial axis. aten.convolution takes a one-element list for all
    axes: `_convolution_mode` (conv2d(padding="valid")) passes padding [0] whatever the rank."""
    return tuple(param) * spatial if len(param) == 1 else tuple(param)


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    acc = opmath_dtype(x.dtype)
    spatial = w.ndim - 2
    stride, padding, dilation, output_padding = (
        _per_axis(p, spatial) for p in (stride, padding, dilation, output_padding))
    if not transposed:
        return lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding], rhs_dilation=dilation,
            feature_group_count=groups, preferred_element_type=acc)
    # A transposed convolution is the input-gradient of a convolution: dilate the input by
    # the stride and convolve with the flipped kernel whose in/out channels swap per group.
    c_in, c_out_g = w.shape[:2]
    k = w.shape[2:]
    w = w.reshape((groups, c_in // groups, c_out_g) + k).swapaxes(1, 2)
    w = jnp.flip(w.reshape((groups * c_out_g, c_in // groups) + k), axis=tuple(range(2, 2 + spatial)))
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op)
            for kk, p, d, op in zip(k, padding, dilation, output_padding)]
    return lax.conv_general_dilated(
        x, w, window_strides=(1,) * spatial, padding=pads, lhs_dilation=stride, rhs_dilation=dilation,
        feature_group_count=groups, preferred_element_type=acc)


@lowers(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + _bcast_channel(opmath(bias), out.ndim)
    return out.astype(input.dtype)


@lowers(aten.convolution_backward.default)
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    def forward(x, w):
        return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups).astype(x.dtype)

    _, vjp = jax.vjp(forward, input, weight)
    grad_input, grad_weight = vjp(grad_output)
    grad_bias = None
    if output_mask[2]:
        axes = (0,) + tuple(range(2, grad_output.ndim))
        grad_bias = jnp.sum(opmath(grad_output), axis=axes).astype(grad_output.dtype)
    return (grad_input if output_mask[0] else None, grad_weight if output_mask[1] else None, grad_bias)


# --------------------------------------------------------------------------- normalization
# Meta functions: PyTorch's meta kernels lay out the saved statistics as CUDA's kernels do.
def _cpu_statistics(meta):
    """Normalisations of a float16/bfloat16 input: CPU saves the mean and inverse std in the input's
    dtype unless a parameter (weight, running stats) is float32 ("mixed type"), then in float32.
    PyTorch's meta kernels follow CUDA instead (always float32; group norm: always the input's)."""
    def override(input, *args, **kwargs):
        out = meta(input, *args, **kwargs)
        if input.dtype not in (torch.float16, torch.bfloat16):
            return out
        mixed = any(isinstance(a, torch.Tensor) and a.dtype == torch.float32 for a in (*args, *kwargs.values()))
        dtype = torch.float32 if mixed else input.dtype
        return (out[0], out[1].to(dtype), out[2].to(dtype), *out[3:])
    return override


def _eval_batch_norm(op, training_index):
    """In eval mode CPU returns empty saved mean/invstd; PyTorch's meta kernels give (C,) ones."""
    def meta(*args, **kwargs):
        out = op(*args, **kwargs)
        training = True if training_index is None else (
            args[training_index] if len(args) > training_index else kwargs["training"])
        if training_index is not None and training:
            return out
        return (out[0], out[1].new_empty((0,)), out[2].new_empty((0,)), *out[3:])
    return meta


def _with_parameters(meta):
    """PyTorch's decomposition of batch norm with update (torch 2.13) picks the backend from weight
    and bias, which must then be tensors: for an affine-free norm, ones and zeros stand in (they
    shape the same results)."""
    def override(input, weight, bias, *args, **kwargs):
        channels = (input.shape[1],)
        weight = input.new_ones(channels) if weight is None else weight
        bias = input.new_zeros(channels) if bias is None else bias
        return meta(input, weight, bias, *args, **kwargs)
    return override


def _batch_norm_no_update_meta(input, weight, bias, running_mean, running_var, momentum, eps):
    out = aten._batch_norm_no_update.default(input, weight, bias, running_mean, running_var, momentum, eps)
    if running_mean is None:
        return out
    return (out[0], out[1].new_empty((0,)), out[2].new_empty((0,)), out[3])


def _affine(xhat, weight, bias, shape):
    if weight is not None:
        xhat = xhat * opmath(weight).reshape(shape)
    if bias is not None:
        xhat = xhat + opmath(bias).reshape(shape)
    return xhat


def _batch_stats(x):
    axes = (0,) + tuple(range(2, x.ndim))
    xu = opmath(x)
    mean = jnp.mean(xu, axis=axes)
    var = jnp.mean(jnp.square(xu - _bcast_channel(mean, x.ndim)), axis=axes)
    return mean, var


def _batch_norm_apply(x, weight, bias, mean, invstd):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    xhat = (opmath(x) - mean.reshape(shape)) * invstd.reshape(shape)
    return _affine(xhat, weight, bias, shape).astype(x.dtype)


def _batch_norm_train(x, weight, bias, eps):
    mean, var = _batch_stats(x)
    invstd = lax.rsqrt(var + eps)
    return _batch_norm_apply(x, weight, bias, mean, invstd), mean, invstd, var


def _running_update(running, batch, momentum):
    return ((1 - momentum) * opmath(running) + momentum * batch).astype(running.dtype)


def _unbiased(var, x):
    n = x.size // x.shape[1]
    return var * (n / max(n - 1, 1))


def _batch_norm_eval(x, weight, bias, running_mean, running_var, eps):
    invstd = lax.rsqrt(opmath(running_var) + eps)
    return _batch_norm_apply(x, weight, bias, opmath(running_mean), invstd), opmath(running_mean), invstd


@lowers(aten._native_batch_norm_legit_functional.default,
        meta=_cpu_statistics(_eval_batch_norm(aten._native_batch_norm_legit_functional.default, 5)))
def native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum,
                                       eps):
    if not training:
        return _batch_norm_eval(input, weight, bias, running_mean, running_var, eps) + (
            running_mean, running_var)
    out, mean, invstd, var = _batch_norm_train(input, weight, bias, eps)
    return (out, mean, invstd, _running_update(running_mean, mean, momentum),
            _running_update(running_var, _unbiased(var, input), momentum))


@lowers(aten._native_batch_norm_legit_no_training.default,
        meta=_cpu_statistics(_eval_batch_norm(aten._native_batch_norm_legit_no_training.default, None)))
def native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm_eval(input, weight, bias, running_mean, running_var, eps)


@lowers(aten._native_batch_norm_legit.no_stats, meta=_cpu_statistics(aten._native_batch_norm_legit.no_stats))
def native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    return _batch_norm_train(input, weight, bias, eps)[:3]


# The mutating overload runs as its lowered functional; its own meta kernel lays out the results.
overrides_meta(aten._native_batch_norm_legit.default)(
    _cpu_statistics(_eval_batch_norm(aten._native_batch_norm_legit.default, 5)))


def _native_batch_norm_redirect(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """aten.native_batch_norm (what F.batch_norm reaches) updates the running stats in place, but
    its schema does not say so, so a lowering could not write them back. Like PyTorch's own
    decomposition of it, run the correctly annotated _native_batch_norm_legit ops instead."""
    if running_mean is None:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    if training:
        return aten._native_batch_norm_legit(input, weight, bias, running_mean, running_var, training,
                                             momentum, eps)
    return aten._native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var,
                                                     momentum, eps)


# (A PrivateUse1 kernel, below autograd: the backward stays native_batch_norm_backward.) Their out=
# overloads run the functionals' kernels and fill the outs.
redirected(_native_batch_norm_redirect, aten.native_batch_norm.default)
out_from_functional(aten.native_batch_norm.out, aten.native_batch_norm.default)
out_from_functional(aten._native_batch_norm_legit.out, aten._native_batch_norm_legit.default)


@lowers(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                               train, eps, output_mask):
    one = jnp.ones((input.shape[1],), opmath(input).dtype)

    def forward(x, w, b):
        if train:
            return _batch_norm_train(x, w, b, eps)[0]
        return _batch_norm_eval(x, w, b, running_mean, running_var, eps)[0]

    _, vjp = jax.vjp(forward, input, one if weight is None else weight, one * 0)
    grads = vjp(grad_out.astype(input.dtype))
    dtypes = (input.dtype, (weight if weight is not None else input).dtype) * 2
    return tuple(g.astype(dt) if m else None for g, dt, m in zip(grads, dtypes, output_mask))


# The batch norm ops torch.export and newer decompositions use: _batch_norm_with_update writes
# the running statistics (its _functional variant returns their new values), _no_update reads them.
_NO_RESERVE = jnp.zeros((0,), jnp.uint8)  # cuDNN's workspace: empty on CPU, and here


# The mutating overload runs as its lowered functional; its own meta kernel lays out the results.
overrides_meta(aten._batch_norm_with_update.default)(
    _cpu_statistics(_with_parameters(aten._batch_norm_with_update.default)))


@lowers(aten._batch_norm_with_update_functional.default,
        meta=_cpu_statistics(_with_parameters(aten._batch_norm_with_update_functional.default)))
def batch_norm_with_update_functional(input, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd, var = _batch_norm_train(input, weight, bias, eps)
    return (out, mean, invstd, _NO_RESERVE, _running_update(running_mean, mean, momentum),
            _running_update(running_var, _unbiased(var, input), momentum))


@lowers(aten._batch_norm_no_update.default, meta=_cpu_statistics(_batch_norm_no_update_meta))
def batch_norm_no_update(input, weight, bias, running_mean, running_var, momentum, eps):
    if running_mean is None:  # no running statistics: the batch's own
        out, mean, invstd, _ = _batch_norm_train(input, weight, bias, eps)
        return out, mean, invstd, _NO_RESERVE
    # CPU leaves the saved statistics empty here (the driver lays them out from its meta override)
    return (*_batch_norm_eval(input, weight, bias, running_mean, running_var, eps), _NO_RESERVE)


@lowers(aten.batch_norm_backward.default)
def batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps,
                        output_mask, reserve):
    train = update or running_mean is None
    return native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_var,
                                      train, eps, output_mask)


def _layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xu = opmath(x)
    mean = jnp.mean(xu, axis=axes, keepdims=True)
    rstd = lax.rsqrt(jnp.mean(jnp.square(xu - mean), axis=axes, keepdims=True) + eps)
    out = _affine((xu - mean) * rstd, weight, bias, tuple(normalized_shape))
    return out.astype(x.dtype), mean, rstd


@lowers(aten.native_layer_norm.default, meta=_cpu_statistics(aten.native_layer_norm.default))
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    return _layer_norm(input, normalized_shape, weight, bias, eps)


def _norm_input_grad(gxhat, xhat, rstd, axes):
    """d loss / d x of xhat = (x - mean) * rstd with statistics over `axes`, given d loss / d xhat."""
    return rstd * (gxhat - jnp.mean(gxhat, axis=axes, keepdims=True)
                   - xhat * jnp.mean(gxhat * xhat, axis=axes, keepdims=True))


def _affine_grads(g, xhat, output_mask, axes, dtype):
    grad_w = jnp.sum(g * xhat, axis=axes).astype(dtype) if output_mask[1] else None
    grad_b = jnp.sum(g, axis=axes).astype(dtype) if output_mask[2] else None
    return grad_w, grad_b


@lowers(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    k = len(normalized_shape)
    axes = tuple(range(input.ndim - k, input.ndim))
    g = opmath(grad_out)
    xhat = (opmath(input) - mean) * rstd
    gxhat = g if weight is None else g * opmath(weight)
    grad_in = _norm_input_grad(gxhat, xhat, rstd, axes).astype(input.dtype) if output_mask[0] else None
    dtype = (weight if weight is not None else input).dtype
    return (grad_in,) + _affine_grads(g, xhat, output_mask, tuple(range(input.ndim - k)), dtype)


def _group_norm(x, weight, bias, n, c, group, eps):
    xu = opmath(x)
    g = xu.reshape(n, group, -1)
    mean = jnp.mean(g, axis=-1, keepdims=True)
    rstd = lax.rsqrt(jnp.mean(jnp.square(g - mean), axis=-1, keepdims=True) + eps)
    xhat = ((g - mean) * rstd).reshape(x.shape)
    out = _affine(xhat, weight, bias, (1, c) + (1,) * (x.ndim - 2))
    return out.astype(x.dtype), mean[..., 0], rstd[..., 0]


@lowers(aten.native_group_norm.default, meta=_cpu_statistics(aten.native_group_norm.default))
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    return _group_norm(input, weight, bias, N, C, group, eps)


@lowers(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    shape = (1, C) + (1,) * (input.ndim - 2)
    g = opmath(grad_out)
    grouped = opmath(input).reshape(N, group, -1)
    mean, rstd = mean.reshape(N, group, 1), rstd.reshape(N, group, 1)
    xhat = (grouped - mean) * rstd
    gxhat = (g if weight is None else g * opmath(weight).reshape(shape)).reshape(N, group, -1)
    grad_in = None
    if output_mask[0]:
        grad_in = _norm_input_grad(gxhat, xhat, rstd, (-1,)).reshape(input.shape).astype(input.dtype)
    axes = (0,) + tuple(range(2, input.ndim))
    dtype = (weight if weight is not None else input).dtype
    return (grad_in,) + _affine_grads(g, xhat.reshape(input.shape), output_mask, axes, dtype)


# ------------------------------------------------------------------------------- softmax
def _along(fn, x, dim):
    """fn(x, axis) in x's computation dtype; a 0-d x is treated as a 1-element vector."""
    xu = opmath(x)
    if xu.ndim == 0:
        return fn(xu.reshape(1), 0).reshape(())
    return fn(xu, dim)


@lowers(aten._softmax.default)
def softmax(self, dim, half_to_float):
    return _along(lambda x, a: jax.nn.softmax(x, axis=a), self, dim)


@lowers(aten._log_softmax.default)
def log_softmax(self, dim, half_to_float):
    return _along(lambda x, a: jax.nn.log_softmax(x, axis=a), self, dim)


@lowers(aten._safe_softmax.default)
def safe_softmax(self, dim, dtype=None):
    # Rows that are entirely -inf (fully masked attention rows) give zeros, not NaN.
    def fn(x, axis):
        x = x.astype(dtype) if dtype is not None else x
        masked = jnp.all(x == -jnp.inf, axis=axis, keepdims=True)
        return jnp.where(masked, 0, jax.nn.softmax(x, axis=axis))

    return _along(fn, self, dim)


@lowers(aten._softmax_backward_data.default)
def softmax_backward_data(grad_output, output, dim, input_dtype):
    def fn(g, a):
        y = opmath(output).reshape(g.shape)
        return y * (g - jnp.sum(g * y, axis=a, keepdims=True))

    return _along(fn, grad_output, dim)


@lowers(aten._log_softmax_backward_data.default)
def log_softmax_backward_data(grad_output, output, dim, input_dtype):
    def fn(g, a):
        return g - jnp.exp(opmath(output).reshape(g.shape)) * jnp.sum(g, axis=a, keepdims=True)

    return _along(fn, grad_output, dim)


# -------------------------------------------------------------------------------- losses
def _class_weights(self, target, weight, ignore_index):
    """Per-target weights (0 where ignored) and targets clamped to valid class indices."""
    class_dim = 0 if self.ndim == 1 else 1
    safe = jnp.clip(target, 0, self.shape[class_dim] - 1)
    w = jnp.ones(target.shape, opmath(self).dtype) if weight is None else opmath(weight)[safe]
    return jnp.where(target == ignore_index, 0, w), safe, class_dim


@lowers(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default, checks=True)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    classes = self.shape[0 if self.ndim == 1 else 1]
    device_assert((target == ignore_index) | ((target >= 0) & (target < classes)),
                  f"target out of bounds for {classes} classes")
    w, safe, class_dim = _class_weights(self, target, weight, ignore_index)
    picked = jnp.take_along_axis(opmath(self), jnp.expand_dims(safe, class_dim), axis=class_dim)
    loss = -jnp.squeeze(picked, class_dim) * w
    total_weight = jnp.sum(w)
    if reduction == _MEAN:
        return jnp.sum(loss) / total_weight, total_weight
    return _reduce(loss, reduction), total_weight


@lowers(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    w, safe, class_dim = _class_weights(self, target, weight, ignore_index)
    g = opmath(grad_output)
    if reduction == _MEAN:
        g = g / total_weight
    picked = jnp.expand_dims(jnp.broadcast_to(-g * w, target.shape), class_dim)
    onehot = jnp.arange(self.shape[class_dim]).reshape((-1,) + (1,) * (self.ndim - class_dim - 1))
    onehot = onehot == jnp.expand_dims(safe, class_dim)
    return jnp.where(onehot, picked, 0).astype(self.dtype)


@lowers(aten.mse_loss.default)
def mse_loss(self, target, reduction=_MEAN):
    return _reduce(jnp.square(opmath(self) - opmath(target)), reduction).astype(self.dtype)


@lowers(aten.mse_loss_backward.default)
def mse_loss_backward(grad_output, self, target, reduction):
    g = _grad_of_reduction(opmath(grad_output), self.shape, reduction)
    return (2 * (opmath(self) - opmath(target)) * g).astype(self.dtype)


@lowers(aten.binary_cross_entropy.default)
def binary_cross_entropy(self, target, weight=None, reduction=_MEAN):
    x, t = opmath(self), opmath(target)
    # PyTorch clamps the logs at -100 so that x = 0 or 1 gives a finite loss.
    loss = -(t * jnp.maximum(jnp.log(x), -100) + (1 - t) * jnp.maximum(jnp.log1p(-x), -100))
    if weight is not None:
        loss = loss * opmath(weight)
    return _reduce(loss, reduction).astype(self.dtype)


@lowers(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=_MEAN):
    x, t = opmath(self), opmath(target)
    grad = _grad_of_reduction(opmath(grad_output), self.shape, reduction) * (x - t) / jnp.maximum(
        (1 - x) * x, 1e-12)
    if weight is not None:
        grad = grad * opmath(weight)
    return grad.astype(self.dtype)


def _smooth_l1(d, beta):
    ad = jnp.abs(d)
    return ad if beta == 0 else jnp.where(ad < beta, 0.5 * d * d / beta, ad - 0.5 * beta)


@lowers(aten.smooth_l1_loss.default)
def smooth_l1_loss(self, target, reduction=_MEAN, beta=1.0):
    return _reduce(_smooth_l1(opmath(self) - opmath(target), beta), reduction).astype(self.dtype)


@lowers(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    d = opmath(self) - opmath(target)
    slope = jnp.sign(d) if beta == 0 else jnp.where(jnp.abs(d) < beta, d / beta, jnp.sign(d))
    return (slope * _grad_of_reduction(opmath(grad_output), self.shape, reduction)).astype(self.dtype)


@lowers(aten.huber_loss.default)
def huber_loss(self, target, reduction=_MEAN, delta=1.0):
    d = opmath(self) - opmath(target)
    ad = jnp.abs(d)
    loss = jnp.where(ad < delta, 0.5 * d * d, delta * (ad - 0.5 * delta))
    return _reduce(loss, reduction).astype(self.dtype)


@lowers(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output, self, target, reduction, delta):
    d = opmath(self) - opmath(target)
    slope = jnp.clip(d, -delta, delta)
    return (slope * _grad_of_reduction(opmath(grad_output), self.shape, reduction)).astype(self.dtype)


# --------------------------------------------------------------------------- embedding, dropout
@lowers(aten.embedding.default, checks=True)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    check_index(indices, weight.shape[0], "embedding index")
    return jnp.take(weight, indices, axis=0)


@lowers(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    idx = indices.reshape(-1)
    g = opmath(grad_output).reshape(idx.shape[0], -1)
    g = jnp.where((idx == padding_idx)[:, None], 0, g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[idx].add(1)
        g = g / counts[idx][:, None]
    grad = jnp.zeros((num_weights, g.shape[1]), g.dtype).at[idx].add(g)
    return grad.astype(grad_output.dtype)


@lowers(aten.embedding_renorm.default)
def embedding_renorm(self, indices, max_norm, norm_type):
    """Rows that `indices` name, rescaled to norm max_norm where their norm exceeds it (CPU's
    scale max_norm / (norm + 1e-7)); other rows unchanged."""
    norm = _vector_norm(opmath(self), norm_type, (1,), False)
    named = jnp.zeros(self.shape[0], bool).at[indices.reshape(-1)].set(True)
    scale = jnp.where(named & (norm > max_norm), max_norm / (norm + 1e-7), 1)
    return (opmath(self) * scale[:, None].astype(opmath(self).dtype)).astype(self.dtype)


@lowers(aten.native_dropout.default, random=True)
def native_dropout(input, p, train, *, key):
    if train is False:
        return input, jnp.ones(input.shape, jnp.bool_)
    keep = jax.random.bernoulli(key, 1 - p, input.shape)
    scale = 0.0 if p == 1 else 1 / (1 - p)
    return (jnp.where(keep, opmath(input) * scale, 0)).astype(input.dtype), keep


@lowers(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    return (opmath(grad_output) * mask * scale).astype(grad_output.dtype)


def _axes_except(v, dim):
    return tuple(a for a in range(v.ndim) if a != dim % v.ndim)


def _norm_except(v, dim):
    """The 2-norm of `v` over every axis but `dim`, kept as size-1 axes (weight norm's `norms`)."""
    return jnp.sqrt(jnp.sum(jnp.square(opmath(v)), axis=_axes_except(v, dim), keepdims=True))


# What torch._weight_norm calls for dim 0 or the last dim (nn.utils weight_norm / parametrizations):
# w = v * g / ||v||, the norm over every other axis; it returns the norms for its backward.
@lowers(aten._weight_norm_interface.default)
def weight_norm_interface(v, g, dim=0):
    norms = _norm_except(v, dim)
    return (opmath(v) * (opmath(g) / norms)).astype(v.dtype), norms.astype(g.dtype)


@overrides_meta(aten._weight_norm_interface.out)
def _weight_norm_interface_out_meta(v, g, dim=0, *, out0, out1):
    # PyTorch's meta for this out= overload hands out0/out1 to a decomposition that takes neither
    from torch._prims_common.wrappers import _maybe_resize_out, _safe_copy_out
    for out, value in zip((out0, out1), aten._weight_norm_interface.default(v, g, dim)):
        _maybe_resize_out(out, value.shape)
        _safe_copy_out(copy_from=value, copy_to=out, exact_dtype=False)
    return out0, out1


@lowers(aten._weight_norm_interface_backward.default)
def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    axes = _axes_except(saved_v, dim)
    grad, v, g, norms = (opmath(t) for t in (grad_w, saved_v, saved_g, saved_norms))
    per_dim = jnp.sum(grad * v, axis=axes, keepdims=True)
    grad_v = (g / norms) * (grad - v * (per_dim / (norms * norms)))
    return grad_v.astype(saved_v.dtype), (per_dim / norms).astype(saved_g.dtype)


# ------------------------------------------------------------------ padding rules
# How each op stays exact on operands padded along a growing axis (padding.py).
@pads(aten.embedding.default)
def _embedding_padding(call):
    # padded indices read row 0, never past the table (device asserts check the bounds)
    return Padding(fills=(Fill("indices", all_axes(call["indices"]), 0),))


@pads(aten.embedding_dense_backward.default)
def _embedding_backward_padding(call):
    if call["scale_grad_by_freq"]:
        return None  # counts the padded indices
    grad, indices = call["grad_output"], call["indices"]
    return Padding(fills=(Fill("grad_output", tuple(range(grad.ndim - 1)), 0), Fill("indices", all_axes(indices), 0)))


@pads(aten.native_layer_norm.default)
def _layer_norm_padding(call):
    x = call["input"]
    return Padding(exact=(("input", tuple(range(x.ndim - len(call["normalized_shape"]), x.ndim))),))


@pads(aten.native_layer_norm_backward.default)
def _layer_norm_backward_padding(call):
    # the weight and bias gradients sum over the leading axes: zero every factor there (also
    # turning NaN/inf computed from padding into 0)
    x = call["input"]
    leading = tuple(range(x.ndim - len(call["normalized_shape"])))
    normalized = tuple(range(len(leading), x.ndim))
    return Padding(fills=tuple(Fill(name, leading, 0) for name in ("grad_out", "input", "mean", "rstd")),
                   exact=(("input", normalized),))


@pads(aten._softmax.default, aten._safe_softmax.default, aten._log_softmax.default)
def _softmax_padding(call):
    """exp(-inf) = 0: a padded position adds nothing to the normaliser."""
    if not call["self"].dtype.is_floating_point:
        return None
    return Padding(fills=(Fill("self", reduced_axes(call), -math.inf),))


@pads(aten._softmax_backward_data.default)
def _softmax_backward_padding(call):
    dim = call["dim"] % call["output"].ndim
    return Padding(fills=(Fill("grad_output", (dim,), 0), Fill("output", (dim,), 0)))


@pads(aten._log_softmax_backward_data.default)
def _log_softmax_backward_padding(call):
    dim = call["dim"] % call["output"].ndim
    return Padding(fills=(Fill("grad_output", (dim,), 0), Fill("output", (dim,), -math.inf)))


@pads(aten.mse_loss.default)
def _mse_loss_padding(call):
    axes = all_axes(call["self"])
    if call["reduction"] == 0:  # none
        return POSITION_WISE
    if call["reduction"] == 2:  # sum
        return Padding(fills=(Fill("self", axes, 0), Fill("target", axes, 0)))

    def masked(c, valid):
        error = jnp.where(valid, wide(c["self"]) - wide(c["target"]), 0)
        return jnp.sum(error * error) / jnp.sum(jnp.broadcast_to(valid, error.shape))

    return Padding(masked=masked, counted_axes=axes)


@pads(aten.mse_loss_backward.default)
def _mse_loss_backward_padding(call):
    axes = all_axes(call["self"])

    def masked(c, valid):
        scale = 2.0 / (jnp.sum(jnp.broadcast_to(valid, c["self"].shape)) if c["reduction"] == 1 else 1)
        grad = scale * (wide(c["self"]) - wide(c["target"])) * wide(c["grad_output"])
        return jnp.where(valid, grad, 0)

    return Padding(masked=masked, counted_axes=axes)


@pads(aten.nll_loss_forward.default, aten.nll_loss_backward.default, aten.nll_loss2d_forward.default,
      aten.nll_loss2d_backward.default)
def _nll_loss_padding(call):
    # padded targets are ignored: they add nothing to the loss, its gradient or total_weight
    return Padding(fills=(Fill("target", all_axes(call["target"]), call["ignore_index"]),))
