"""Lowerings: fake quantization (torch.ao.quantization's FakeQuantize, QAT), as CPU computes it.

neuron has no quantized tensors (eager/unsupported.py refuses them); fake quantization is how
quantization runs here: values are rounded to the quantized grid and back, in float. CPU's kernels
round `x * (1 / scale)` half to even in float32 and add the zero point, clamp to
[quant_min, quant_max] and scale back; the mask marks the values that were inside the range (the
gradient passes only there).
"""
from __future__ import annotations

import jax.numpy as jnp

from . import aten, lowers


def _fake_quantize(x, scale, zero_point, quant_min, quant_max):
    # CPU's scale and its inverse are floats (a double input widens the inverse to round in double);
    # q - zero_point scales back in float, or in double for a float zero point (per channel only),
    # where the difference is no integer.
    compute = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    scale = jnp.asarray(scale, jnp.float32)
    inverse = (jnp.float32(1) / scale).astype(compute)
    if jnp.issubdtype(jnp.asarray(zero_point).dtype, jnp.floating):
        q = jnp.round(jnp.asarray(zero_point, compute) + x.astype(compute) * inverse)
        zero_point, scale = jnp.asarray(zero_point, jnp.float64), scale.astype(jnp.float64)
    else:
        q = jnp.round(x.astype(compute) * inverse) + jnp.asarray(zero_point, compute)
    mask = (q >= quant_min) & (q <= quant_max)
    out = (jnp.clip(q, quant_min, quant_max).astype(scale.dtype) - jnp.asarray(zero_point, scale.dtype)) * scale
    return out.astype(x.dtype), mask


@lowers(aten.fake_quantize_per_tensor_affine_cachemask.default)
def fake_quantize_per_tensor(self, scale, zero_point, quant_min, quant_max):
    # scale is a double in the schema; CPU's kernel takes it as a float
    return _fake_quantize(self, jnp.float32(scale), zero_point, quant_min, quant_max)


@lowers(aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default)
def fake_quantize_per_tensor_tensor_qparams(self, scale, zero_point, fake_quant_enabled, quant_min, quant_max):
    out, mask = _fake_quantize(self, scale.reshape(()), zero_point.reshape(()), quant_min, quant_max)
    enabled = fake_quant_enabled.reshape(-1)[0] != 0  # off: the input as it is, every value passing
    return jnp.where(enabled, out, self), mask | ~enabled


@lowers(aten.fake_quantize_per_channel_affine_cachemask.default)
def fake_quantize_per_channel(self, scale, zero_point, axis, quant_min, quant_max):
    shape = [1] * self.ndim
    shape[axis] = -1
    return _fake_quantize(self, scale.reshape(shape), zero_point.reshape(shape), quant_min, quant_max)
