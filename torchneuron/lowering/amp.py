"""Automatic mixed precision: CUDA's autocast policy for neuron's ops (amp/ registers the kernels
from it), and the ops GradScaler needs: unscale-and-check gradients, update the scale.

The scaler's ops mutate two arguments each; the functional overloads lowered here return the new
values and their in-place overloads (redirects) write them back.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch

from . import aten, lowers, overloads, record, redirected

# CUDA's lists (autocast_mode.cpp), by op name.
_LOWER = ("_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
          "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
          "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
          "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "scaled_dot_product_attention",
          "_scaled_dot_product_attention_math", "_scaled_dot_product_fused_attention_overrideable")
_FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
         "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm", "native_group_norm",
         "batch_norm", "native_batch_norm", "instance_norm", "rms_norm", "frobenius_norm", "nuclear_norm",
         "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
         "nll_loss_nd", "cross_entropy_loss", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss",
         "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
         "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist",
         "cdist", "renorm", "logsumexp", "prod", "softmax", "log_softmax", "_softmax", "_log_softmax", "cumprod",
         "cumsum", "sum", "linalg_vector_norm", "linalg_matrix_norm", "norm", "upsample_nearest1d",
         "upsample_nearest2d", "upsample_nearest3d", "upsample_bilinear2d", "upsample_trilinear3d",
         "upsample_bicubic2d", "upsample_linear1d", "fft_fft", "fft_ifft", "fft_rfft", "fft_irfft")
_PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
            "scatter_add", "tensordot", "cat", "stack", "index_copy")


def autocasts(kind: str, *names: str) -> None:
    """Each tensor-returning overload of the ops `names` runs in autocast class `kind`: "lower" (the
    autocast dtype), "fp32" (float32) or "promote" (the widest floating dtype of its inputs)."""
    for name in names:
        packet = getattr(aten, name, None)
        for op in overloads(packet) if packet is not None else ():
            # out= overloads write a given tensor: CUDA's autocast does not cast those.
            if not any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
                record(op).autocast = kind


autocasts("lower", *_LOWER)
autocasts("fp32", *_FP32)
autocasts("promote", *_PROMOTE)


@lowers(aten._amp_foreach_non_finite_check_and_unscale.default)
def non_finite_check_and_unscale(self, found_inf, inv_scale):
    # found_inf becomes 1 if any gradient holds an inf or NaN (it may already be 1).
    bad = jnp.zeros((), bool)
    for g in self:
        bad = bad | ~jnp.all(jnp.isfinite(g))
    unscaled = [(g.astype(jnp.float32) * inv_scale.reshape(())).astype(g.dtype) for g in self]
    return unscaled, jnp.where(bad, jnp.ones_like(found_inf), found_inf)


@lowers(aten._amp_update_scale.default)
def update_scale(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval):
    # A step with infs backs off and restarts the count; growth_interval clean steps grow the scale.
    inf = found_inf.reshape(()) > 0
    tracker = growth_tracker + 1
    grow = tracker >= growth_interval
    grown = jnp.where(grow, self * scale_growth_factor, self)
    scale = jnp.where(inf, self * scale_backoff_factor, grown)
    tracker = jnp.where(inf | grow, jnp.zeros_like(growth_tracker), tracker)
    return scale.astype(self.dtype), tracker


def _unscale_(grads, found_inf, inv_scale):
    new, found = aten._amp_foreach_non_finite_check_and_unscale.default(grads, found_inf, inv_scale)
    torch._foreach_copy_(grads, new)
    found_inf.copy_(found)


def _update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    new, tracker = aten._amp_update_scale.default(scale, growth_tracker, found_inf, growth_factor,
                                                  backoff_factor, growth_interval)
    scale.copy_(new)
    growth_tracker.copy_(tracker)
    return scale


redirected(_unscale_, aten._amp_foreach_non_finite_check_and_unscale_.default)
redirected(_update_scale_, aten._amp_update_scale_.default)
