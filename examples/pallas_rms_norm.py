"""RMSNorm as a Pallas kernel, a PyTorch op on neuron (and CPU) through `torchneuron.jax_op`.

The forward is a `pl.pallas_call`; its backward is a second op written in plain JAX and registered
with `register_autograd` (Pallas kernels have no automatic transpose, so `jax.vjp` cannot be the
default here). Pallas runs interpreted where the arrays live on the CPU (XLA:CPU has no Pallas
compiler) and compiled elsewhere.

    python examples/pallas_rms_norm.py
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

import torchneuron


def _interpret() -> bool:
    """Interpret the kernel when this trace targets the CPU: the device `jax.default_device` names
    (our CPU kernels set it), else JAX's first device."""
    device = jax.config.jax_default_device or jax.devices()[0]
    return (device if isinstance(device, str) else device.platform) == "cpu"


def _compute_dtype(dtype):
    """Half precision computes in float32 and rounds once; float32 and float64 in themselves."""
    return jnp.promote_types(dtype, jnp.float32)


def _rms_norm_kernel(x_ref, w_ref, o_ref, *, eps: float):
    x = x_ref[...].astype(_compute_dtype(x_ref.dtype))
    scale = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    o_ref[...] = (x * scale * w_ref[...].astype(x.dtype)).astype(o_ref.dtype)


@torchneuron.jax_op("examples::pallas_rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2, -1) + eps) * weight over the last axis, one Pallas block."""
    return pl.pallas_call(functools.partial(_rms_norm_kernel, eps=eps),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=_interpret())(x, weight)


@torchneuron.jax_op("examples::pallas_rms_norm_backward")
def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of rms_norm for x and weight, in plain JAX."""
    dtype = _compute_dtype(x.dtype)
    g, xf, w = grad.astype(dtype), x.astype(dtype), weight.astype(dtype)
    scale = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    gw = g * w
    dx = scale * gw - xf * scale**3 * jnp.mean(gw * xf, axis=-1, keepdims=True)
    dw = jnp.sum((g * xf * scale).reshape(-1, w.shape[-1]), axis=0)
    return dx.astype(x.dtype), dw.astype(weight.dtype)


def _setup_context(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    dx, dw = rms_norm_backward(grad, x, weight, ctx.eps)
    return dx, dw, None


rms_norm.register_autograd(_backward, setup_context=_setup_context)


if __name__ == "__main__":
    x = torch.randn(8, 64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    rms_norm(x, w, 1e-6).square().sum().backward()
    xn = x.detach().to("neuron").requires_grad_()
    wn = w.detach().to("neuron").requires_grad_()
    rms_norm(xn, wn, 1e-6).square().sum().backward()
    print("max |dx neuron - dx cpu|:", (xn.grad.cpu() - x.grad).abs().max().item())
    print("max |dw neuron - dw cpu|:", (wn.grad.cpu() - w.grad).abs().max().item())
