"""The kernels that cross the host/device boundary or move between NeuronCores: `copy_` in every
direction and `.item()`.

Same-device copies go through the driver like any op (aten.copy is in the lowering table), so
views, broadcasting, dtype casts and math bits need no special case. A copy from the host or
another core puts the source on the destination's core once; into a destination that covers
its storage that buffer is the result, otherwise the driver copies it into place.
"""
from __future__ import annotations

import torch

from ..runtime import storages, tables, transfer
from ..runtime.dtypes import TORCH_TO_JAX, UnsupportedDtypeError
from . import driver

_copy = torch.ops.aten.copy_.default


# the runtime's read and write programs, one per layout (bounded by their functools caches)
for _name, _maker in (("read programs", transfer._reader), ("write programs", transfer._writer)):
    tables.register(_name, lambda maker=_maker: maker.cache_info().currsize, _maker.cache_info().maxsize)


def copy_(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    for t in (dst, src):
        if t.dtype not in TORCH_TO_JAX:
            raise UnsupportedDtypeError(t.dtype, f"copy_ from {src.dtype} on {src.device} to {dst.dtype} on {dst.device}")
    if dst.device.type != "neuron":  # neuron -> host
        return dst.copy_(transfer.host_tensor(transfer.to_host(src), src.dtype))
    if src.device == dst.device:
        return driver.run_op(_copy, dst, src, non_blocking)  # the driver reads and writes math bits
    if src.device.type == "neuron":  # another NeuronCore
        flat = transfer.put(transfer.logical_value_of(src).reshape(-1), dst.device.index)
    else:
        if src.dtype != dst.dtype and not src.dtype.is_complex:
            src = src.to(dst.dtype)  # cast on the host: the smaller upload, usually
        if src.dtype == dst.dtype and src.shape == dst.shape and _permuted_whole_storage(dst):
            # (`.to()` of a transposed tensor keeps its strides): laid out on the host, so the
            # upload is the buffer itself, not a zeros and a write program for each new shape
            host = torch.empty_strided(dst.shape, dst.stride(), dtype=src.dtype).copy_(src)
            flat = transfer.put(transfer.cpu_numpy(host.as_strided((host.numel(),), (1,))), dst.device.index)
            storages.drain()  # (frees first: a freed storage's handle may be this one's)
            storages.bind(dst.untyped_storage().data_ptr(), flat)
            return dst
        flat = transfer.put(transfer.cpu_numpy(src).reshape(-1), dst.device.index)
    if src.dtype == dst.dtype and src.shape == dst.shape:
        transfer.assign(dst, flat)
        return dst
    # a complex source into a real destination, or a broadcast: the driver's copy decides
    staged = transfer.wrap(flat, src.shape, src.dtype, dst.device)
    return driver.run_op(_copy, dst, staged, non_blocking)


def _permuted_whole_storage(t: torch.Tensor) -> bool:
    """Whether `t` holds every element of its storage, once each, in an order other than its own
    (a permuted contiguous tensor), with no math bits."""
    return (not t.is_contiguous() and not t.storage_offset() and not t.is_conj() and not t.is_neg()
            and t.numel() * t.element_size() == t.untyped_storage().nbytes()
            and transfer.layout_of(t).dense_order() is not None)


def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return copy_(dst, src, non_blocking)


def local_scalar_dense(t: torch.Tensor):
    value = transfer.to_host(t).reshape(()).item()
    if t.dtype.is_complex:
        return complex(value)
    if t.dtype.is_floating_point:
        return float(value)
    if t.dtype == torch.bool:
        return bool(value)
    return int(value)
