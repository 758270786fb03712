"""Values in and out of storages: host <-> device, and reading or writing a tensor's layout.

`value_of` reads a neuron tensor as a JAX array of its shape (a cached, jit-compiled read of its
layout); `assign` writes a JAX array into a tensor's elements (a tensor that covers its whole
storage takes the array as its buffer: an upload is one device buffer); `put`, `wrap` and
`new_from_value` make device buffers and new neuron tensors.
"""
from __future__ import annotations

import functools

import jax
import numpy as np
import torch

from . import device_asserts, devices, executables, storages
from .dtypes import FLOAT8, to_jax, to_torch
from .layout import Layout, apply_math_bits, read, write

# Dtypes numpy has no type for: their bytes cross the host boundary as integers of the same width.
_RAW_HOST_DTYPES = (torch.bfloat16, *sorted(FLOAT8, key=str), torch.uint16, torch.uint32, torch.uint64)
_TORCH_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_INT_OF_WIDTH = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


def layout_of(t: torch.Tensor) -> Layout:
    return Layout(tuple(t.shape), tuple(t.stride()), t.storage_offset())


@functools.lru_cache(maxsize=4096)
def _reader(layout: Layout, dtype, buffer_dtype, buffer_length):
    del buffer_dtype, buffer_length  # part of the cache key: jit specialises on them anyway
    return executables.Function(lambda buf: read(storages.bitcast(buf, dtype), layout), "runtime", "read",
                                identity=repr(("read", tuple(layout), str(dtype))))


@functools.lru_cache(maxsize=4096)
def _writer(layout: Layout, dtype, bits, buffer_dtype, buffer_length):
    del buffer_dtype, buffer_length

    def write_value(buf, value):
        value = apply_math_bits(value.reshape(layout.shape), bits)
        return write(storages.bitcast(buf, dtype), layout, value)
    return executables.Function(write_value, "runtime", "write", donate_argnums=(0,),
                                identity=repr(("write", tuple(layout), str(dtype), tuple(bits))))


def value_of(t: torch.Tensor) -> jax.Array:
    """The values neuron tensor `t` stores, as a JAX array of t's shape and dtype (math bits not
    applied: see `logical_value_of`)."""
    storages.drain()
    buf = storages.buffer_of(t)
    dtype = to_jax(t.dtype)
    if buf.dtype == dtype and buf.shape[0] == t.numel() and t.is_contiguous() and not t.storage_offset():
        return buf.reshape(tuple(t.shape))
    layout = layout_of(t)
    return _reader(layout, dtype, buf.dtype, buf.shape[0])(buf)


def logical_value_of(t: torch.Tensor) -> jax.Array:
    """The values a conj- or neg-bit view means, from the physical values it stores."""
    return apply_math_bits(value_of(t), (t.is_conj(), t.is_neg()))


def assign(t: torch.Tensor, value: jax.Array) -> None:
    """Write `value` (t's elements in t's dtype on t's device, in t's shape or flat) into neuron
    tensor `t`, through t's layout and math bits. A tensor that covers its storage densely
    takes the value as its buffer; any other is a jit-compiled write into its (donated) buffer."""
    storages.drain()
    handle = t.untyped_storage().data_ptr()
    if not handle:
        return  # no bytes to write
    layout = layout_of(t)
    bits = (t.is_conj(), t.is_neg())
    if (bits == (False, False) and layout.offset == 0 and layout.is_contiguous()
            and layout.numel * t.element_size() == t.untyped_storage().nbytes()):
        storages.bind(handle, value if value.ndim == 1 else value.reshape(-1))
        return
    buf = storages.buffer_of(t)
    storages.bind(handle, _writer(layout, to_jax(t.dtype), bits, buf.dtype, buf.shape[0])(buf, value))


def cpu_numpy(t: torch.Tensor) -> np.ndarray:
    """A host tensor's values as numpy, including dtypes numpy lacks (bfloat16, float8). Through
    DLPack, not Tensor.numpy(), which marks the tensor's storage not resizable for good: a CPU
    tensor copied to neuron must stay as resizable as it was (out= of it, resize_)."""
    t = t.detach().resolve_conj().resolve_neg().contiguous()
    if t.dtype in _RAW_HOST_DTYPES:
        return np.from_dlpack(t.view(_TORCH_INT_OF_WIDTH[t.element_size()])).view(np.dtype(to_jax(t.dtype)))
    return np.from_dlpack(t)


def host_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of `dtype` holding numpy `array` (copied unless it is writable and contiguous)."""
    array = np.array(array, copy=not array.flags.c_contiguous or not array.flags.writeable)
    if dtype in _RAW_HOST_DTYPES:
        return torch.from_numpy(array.view(_NUMPY_INT_OF_WIDTH[array.dtype.itemsize]).copy()).view(dtype)
    return torch.from_numpy(array)


def to_host(t: torch.Tensor) -> np.ndarray:
    """The values neuron tensor `t` means, on the host (a synchronisation: device-side assert
    failures so far are raised)."""
    value = _host_view(t)
    if value is None:
        value = np.asarray(logical_value_of(t))
    device_asserts.raise_failures()
    return value


_HOST_VIEW_BYTES = 1 << 20


def _host_view(t: torch.Tensor) -> np.ndarray | None:
    """A view's values taken from its whole buffer on the host, where the buffer is small or
    not much larger than the view: no executable per layout (a storage grown at a bucketed size
    has a buffer longer than its bytes, a new length each step). None where the device should
    read the view first."""
    if t.is_conj() or t.is_neg() or not t.numel():
        return None
    storages.drain()
    buf = storages.buffer_of(t)
    dtype = np.dtype(to_jax(t.dtype))
    itemsize = dtype.itemsize
    if buf.dtype != dtype or (buf.shape[0] * itemsize > _HOST_VIEW_BYTES and buf.shape[0] > 2 * t.numel()):
        return None
    # strided over raw bytes: as_strided goes through __array_interface__, whose type string
    # ('<f1') loses ml_dtypes' float8 types
    host = np.asarray(buf).view(np.dtype((np.void, itemsize)))
    view = np.lib.stride_tricks.as_strided(host[t.storage_offset():], tuple(t.shape),
                                           tuple(s * itemsize for s in t.stride()), writeable=False)
    return np.array(view).view(dtype)


def put(array, device_index: int) -> jax.Array:
    """A host array, or a JAX array on another core, on a NeuronCore. Host memory is copied, never
    aliased: the caller may change it afterwards."""
    if isinstance(array, np.ndarray) and devices.HOST_MEMORY:
        # XLA:CPU adopts host memory it is handed (also with may_alias=False, for arrays that
        # do not own their data, such as a CPU tensor's): hand it a copy of its own.
        array = array.copy()
    return jax.device_put(array, devices.jax_device(device_index))


def wrap(flat: jax.Array, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A new contiguous neuron tensor of `shape` whose storage holds `flat` (on its core)."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if out.numel():
        storages.bind(out.data_ptr(), flat)
    return out


def new_from_value(value: jax.Array, device: torch.device) -> torch.Tensor:
    """A new contiguous neuron tensor holding JAX array `value`."""
    return wrap(put(value.reshape(-1), device.index), value.shape, to_torch(value.dtype), device)
