"""Autocast for neuron: `torch.autocast("neuron", dtype=torch.bfloat16 or torch.float16)`.

PyTorch ships autocast kernels for CUDA, CPU, XPU, MPS... but none for PrivateUse1, so this
module registers them on the AutocastPrivateUse1 dispatch key with CUDA's op policy:

- LOWER ops (matmuls, convolutions, attention, as CUDA lists its fused attention) run in the
  autocast dtype;
- FP32 ops (reductions, softmax, norms, losses, exp/log/pow...) run in float32;
- PROMOTE ops (cat, stack, addcmul...) run in the widest floating dtype among their inputs;

and a fallthrough for every other op. As in CUDA's `cached_cast`, only floating neuron
tensors are cast and float64 ones are left alone by LOWER and FP32 ops. The cast operands are
passed to the op with autocast excluded, so autograd records the casts and the op.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten
KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

LOWER = ("_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
         "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
         "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
         "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "scaled_dot_product_attention",
         "_scaled_dot_product_attention_math", "_scaled_dot_product_fused_attention_overrideable")
FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
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
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
           "scatter_add", "tensordot", "cat", "stack", "index_copy")

_lib = None


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _cast(value, dtype, keep_double: bool):
    if isinstance(value, torch.Tensor):
        eligible = value.is_floating_point() and value.device.type == "neuron"
        if eligible and value.dtype != dtype and not (keep_double and value.dtype == torch.float64):
            return value.to(dtype)
        return value
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_cast(v, dtype, keep_double) for v in value)
    return value


def _call(op, dtype, keep_double, args, kwargs):
    args = [_cast(a, dtype, keep_double) for a in args]
    kwargs = {k: _cast(v, dtype, keep_double) for k, v in kwargs.items()}
    with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
        return op(*args, **kwargs)


def _lower_kernel(op):
    def kernel(*args, **kwargs):
        return _call(op, torch.get_autocast_dtype("neuron"), True, args, kwargs)
    return kernel


def _fp32_kernel(op):
    def kernel(*args, **kwargs):
        return _call(op, torch.float32, True, args, kwargs)
    return kernel


def _promote_kernel(op):
    def kernel(*args, **kwargs):
        floats = [t.dtype for t in _tensors((args, list(kwargs.values())))
                  if t.is_floating_point() and t.device.type == "neuron"]
        if not floats:
            return _excluded(op, args, kwargs)
        widest = floats[0]
        for d in floats[1:]:
            widest = torch.promote_types(widest, d)
        return _call(op, widest, False, args, kwargs)
    return kernel


def _excluded(op, args, kwargs):
    with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
        return op(*args, **kwargs)


def _overloads(name: str):
    packet = getattr(aten, name, None)
    if packet is None:
        return []
    return [getattr(packet, o) for o in packet.overloads()]


def policy() -> dict:
    """op overload -> "lower" | "fp32" | "promote" (the ops this module gives an autocast kernel)."""
    table = {}
    for kind, names in (("lower", LOWER), ("fp32", FP32), ("promote", PROMOTE)):
        for name in names:
            for op in _overloads(name):
                if _returns_tensor(op):
                    table[op] = kind
    return table


def _returns_tensor(op) -> bool:
    # out= overloads write a given tensor: CUDA's autocast does not cast those.
    return not any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)


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


def install() -> None:
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    makers = {"lower": _lower_kernel, "fp32": _fp32_kernel, "promote": _promote_kernel}
    for op, kind in policy().items():
        _lib.impl(op, makers[kind](op), KEY)
    # The driver derives in-place variants that mutate only their first argument; these two
    # mutate two, so they run their functional lowering (lowering/amp.py) and write back here.
    _lib.impl(aten._amp_foreach_non_finite_check_and_unscale_.default, _unscale_, "PrivateUse1")
    _lib.impl(aten._amp_update_scale_.default, _update_scale_, "PrivateUse1")
    _fallthrough = torch.library.Library("_", "IMPL")
    _fallthrough.fallback(torch.library.fallthrough_kernel, dispatch_key=KEY)
    _lib._fallthrough = _fallthrough  # keep the registration alive with the kernels
