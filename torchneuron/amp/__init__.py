"""Autocast for neuron: `torch.autocast("neuron", dtype=torch.bfloat16 or torch.float16)`.

PyTorch ships autocast kernels for CUDA, CPU, XPU, MPS... but none for PrivateUse1, so this
module registers them on the AutocastPrivateUse1 dispatch key with CUDA's op policy (each op's
record says its class; the lists are in lowering/amp.py):

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

from ..lowering import Facet

AUTOCAST = Facet("autocast")
KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

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


def policy() -> dict:
    """op overload -> "lower" | "fp32" | "promote": the ops this module gives an autocast kernel
    (their records' `autocast`, lowering/amp.py)."""
    return dict(AUTOCAST.items())


def install() -> None:
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    makers = {"lower": _lower_kernel, "fp32": _fp32_kernel, "promote": _promote_kernel}
    for op, kind in policy().items():
        _lib.impl(op, makers[kind](op), KEY)
    _fallthrough = torch.library.Library("_", "IMPL")
    _fallthrough.fallback(torch.library.fallthrough_kernel, dispatch_key=KEY)
    _lib._fallthrough = _fallthrough  # keep the registration alive with the kernels
