"""Moving values between host and device, and between NeuronCores.

`value_of` reads a neuron tensor as a JAX array of its shape (a cached, jit-compiled read of
its layout). `copy_` covers every direction; same-device copies go through the driver like
any op (aten.copy is in the lowering table), so views and broadcasting need no special case.
"""
from __future__ import annotations

import functools

import jax
import numpy as np
import torch

from ..runtime import devices, storages
from ..runtime.dtypes import TORCH_TO_JAX, UnsupportedDtypeError, to_jax
from .layout import Layout, apply_math_bits, read


@functools.lru_cache(maxsize=4096)
def _reader(layout: Layout, dtype, buffer_dtype, buffer_length):
    del buffer_dtype, buffer_length  # part of the cache key: jit specialises on them anyway
    return jax.jit(lambda buf: read(storages.bitcast(buf, dtype), layout))


def buffer_of(t: torch.Tensor) -> jax.Array:
    from .driver import _buffer_for
    storages.drain()
    return _buffer_for(t, t.untyped_storage().data_ptr())


def value_of(t: torch.Tensor) -> jax.Array:
    """The values of neuron tensor `t` as a JAX array of t's shape and dtype."""
    buf = buffer_of(t)
    layout = Layout(tuple(t.shape), tuple(t.stride()), t.storage_offset())
    dtype = to_jax(t.dtype)
    if buf.dtype == dtype and buf.shape[0] == t.numel() and t.is_contiguous() and not t.storage_offset():
        return buf.reshape(layout.shape)
    return _reader(layout, dtype, buf.dtype, buf.shape[0])(buf)


def to_host(t: torch.Tensor) -> np.ndarray:
    return np.asarray(_logical(t, value_of(t)))


def from_host(array: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A new contiguous neuron tensor holding `array`."""
    out = torch.empty(array.shape, dtype=dtype, device=device)
    if out.numel():
        storages.buffers[out.data_ptr()] = jax.device_put(
            np.asarray(array).reshape(-1), devices.jax_device(out.device.index))
    return out


def from_value(value: jax.Array, device: torch.device) -> torch.Tensor:
    """A new contiguous neuron tensor holding JAX array `value`."""
    from ..runtime.dtypes import to_torch
    out = torch.empty(value.shape, dtype=to_torch(value.dtype), device=device)
    if out.numel():
        storages.buffers[out.data_ptr()] = jax.device_put(value.reshape(-1), devices.jax_device(out.device.index))
    return out


def cpu_numpy(t: torch.Tensor) -> np.ndarray:
    """A host tensor's values as numpy, including dtypes numpy lacks (bfloat16, float8)."""
    t = t.detach().resolve_conj().resolve_neg().contiguous()
    jdt = np.dtype(to_jax(t.dtype))
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16,
                   torch.uint32, torch.uint64):
        raw = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        return t.view(raw).numpy().view(jdt)
    return t.numpy()


def host_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    array = np.array(array, copy=not array.flags.c_contiguous or not array.flags.writeable)
    if dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32,
                 torch.uint64):
        raw = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[array.dtype.itemsize]
        return torch.from_numpy(array.view(raw).copy()).view(dtype)
    return torch.from_numpy(array)


def _logical(t: torch.Tensor, value):
    """The values a conj- or neg-bit view means, from the physical values it stores."""
    return apply_math_bits(value, (t.is_conj(), t.is_neg()))


def copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    for t in (dst, src):
        if t.dtype not in TORCH_TO_JAX:
            raise UnsupportedDtypeError(t.dtype, f"copy_ from {src.dtype} on {src.device} to {dst.dtype} on {dst.device}")
    if dst.device.type == "neuron" and src.device.type == "neuron" and dst.device == src.device:
        return _same_device_copy(dst, src, non_blocking)  # the driver reads and writes math bits
    if dst.device.type == "neuron":
        if src.device.type == "neuron":  # another NeuronCore
            value = jax.device_put(_logical(src, value_of(src)), devices.jax_device(dst.device.index))
            staged = from_value(value, dst.device)
        else:
            host = src.to(dst.dtype) if src.dtype != dst.dtype and src.dtype.is_complex is False else src
            staged = from_host(cpu_numpy(host), dst.device, host.dtype)
        return _same_device_copy(dst, staged, non_blocking)
    # neuron -> host
    host = host_tensor(to_host(src), src.dtype)
    return dst.copy_(host)


def _same_device_copy(dst, src, non_blocking):
    from .kernels import run_op
    return run_op(torch.ops.aten.copy_.default, dst, src, non_blocking)


def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return copy_(dst, src, non_blocking)


def local_scalar_dense(t: torch.Tensor):
    value = to_host(t).reshape(()).item()
    if t.dtype.is_complex:
        return complex(value)
    if t.dtype.is_floating_point:
        return float(value)
    if t.dtype == torch.bool:
        return bool(value)
    return int(value)
