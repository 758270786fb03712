"""Storages: one flat device buffer (a 1-D jax.Array) per PyTorch storage.

A storage's data pointer is an opaque handle from the C++ allocator; the table here maps it to
the buffer, and this module is the only place that touches the table. Drivers (eager, compile,
distributed) use its small interface:

    lookup(handle)                 the buffer, or None while the storage was never written
    buffer_of(tensor)              the buffer, materialised as zeros if never written
    bind(handle, buffer)           a storage's new buffer (after a write)
    new_tensor(prototype, ...)     a fresh tensor whose storage holds a given buffer

The buffer keeps the dtype that last wrote it; a read with another dtype bitcasts.
`torch.empty` leaves a storage unmaterialised until its first write. Frees and growths arrive
from the C++ core as an ordered event queue, drained here at safe points (before a buffer is
bound, on synchronize and on memory queries).
"""
from __future__ import annotations

import collections
import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import deferred, devices, executables, host_memory, tables
from .core import EVENT_FREE, EVENT_GROW, StorageEvent, lib, pending, urgent
from .dtypes import to_jax

_buffers: dict[int, jax.Array] = {}
# A bound method of the one table (never rebound): the per-op paths call it without a lookup.
lookup = _buffers.get
# Storages written since the last synchronize: the only buffers it must wait for (every other one
# was ready at that synchronize, and a buffer never changes). Frees discard theirs. Handles, never
# buffers: a pending value's liveness is its reference count (deferred.flush).
_unsynced: set[int] = set()
_note_unsynced = _unsynced.add
# Storages bound to a pending value since the last flush: the only ones it must rebind.
_unflushed: list[int] = []
# The latest results, kept so that synchronize() also waits for work whose tensors already died.
# Only where a call can return before its work is done: inline XLA:CPU has finished it, and there
# buffers that die young also free faster (about half a microsecond per small op).
KEEP_RECENT = devices.ASYNCHRONOUS
recent: collections.deque = collections.deque(maxlen=32)
_drain_lock = threading.Lock()
_PENDING = deferred.Pending
_EVENTS = (StorageEvent * 256)()
# The same memory as rows of six integers: one tolist() reads a batch, where ctypes would build
# an object and convert each field of every event.
_EVENT_ROWS = np.frombuffer(_EVENTS, dtype=np.uint64).reshape(len(_EVENTS), 6)


def bind(handle: int, buf) -> None:
    """Storage `handle`'s new buffer (an array, or a pending value of fused eager's segment)."""
    _buffers[handle] = buf
    _note_unsynced(handle)
    if type(buf) is deferred.Pending:
        _unflushed.append(handle)


def bind_each(handles: list, bufs) -> None:
    """`bind` for each handle (none 0) and its buffer, in bulk (a foreach op writes tens of storages,
    a graph replay a hundred; extra buffers are left out)."""
    _buffers.update(zip(handles, bufs))
    _unsynced.update(handles)
    if _PENDING in set(map(type, bufs)):
        _unflushed.extend(h for h, b in zip(handles, bufs) if type(b) is _PENDING)


def table() -> dict:
    """handle -> buffer, for the runtime's own passes over every storage (graph capture); write
    through bind and bind_each."""
    return _buffers


def _take_computed() -> None:
    """After a fused segment ran: storages bound to its values hold the arrays themselves."""
    # (a capture's pending values are not computed by flushes: capture.end or abort rebinds them;
    # only the handles seen are dropped: another thread may bind while this runs)
    seen = len(_unflushed)
    for handle in _unflushed[:seen]:
        buf = _buffers.get(handle)
        if type(buf) is deferred.Pending and buf.value is not None:
            _buffers[handle] = buf.value  # (not bind: the handle is unsynced since its pending bind)
    del _unflushed[:seen]


def maybe_drain() -> None:
    """The per-op safe point: apply queued events once a growth waits or frees have piled up.
    Frees can wait: an address is not reused before its buffer is dropped here."""
    if urgent.value:
        drain()


def drain() -> None:
    """Apply the frees and growths the C++ core has queued, in order."""
    if not pending.value:
        return
    freed = 0
    with _drain_lock:
        pop, discard = _buffers.pop, _unsynced.discard
        while n := lib.tn_take_events(_EVENTS, len(_EVENTS)):
            for kind, handle, new_handle, device, nbytes, new_nbytes in _EVENT_ROWS[:n].tolist():
                if kind == EVENT_FREE:
                    pop(handle, None)
                    discard(handle)
                    freed += nbytes
                elif kind == EVENT_GROW:
                    old = _buffers.get(handle)
                    if type(old) is deferred.Pending:  # a storage grows from a value not computed yet
                        old = deferred.concrete(old, drain=False)
                    if old is not None:
                        itemsize = old.dtype.itemsize
                        bind(new_handle, fit(old[: nbytes // itemsize], old.dtype, new_nbytes // itemsize, device))
            lib.tn_release_taken()
    if devices.HOST_MEMORY:  # (buffers in host memory: malloc may keep what they held)
        host_memory.freed(freed)


def buffer_of(t: torch.Tensor) -> jax.Array:
    """The buffer of neuron tensor `t`'s storage; a storage never written is bound to zeros
    first (a storage without a handle, of no bytes, gets an empty buffer of its own)."""
    handle = t.untyped_storage().data_ptr()
    buf = _buffers.get(handle)
    if type(buf) is deferred.Pending:
        return deferred.concrete(buf)
    if buf is None:
        dtype = to_jax(t.dtype)
        buf = fit(None, dtype, t.untyped_storage().nbytes() // np.dtype(dtype).itemsize, t.device.index)
        if handle:
            bind(handle, buf)
            deferred.note_storage_buffer(handle, buf)  # (a capture reads this storage afresh at replay)
    return buf


def buffer_for_call(t: torch.Tensor):
    """`buffer_of` for an eager call about to read or write `t` (or to build its plan, which reads
    the buffer's length and dtype): in fused eager (outside a graph capture) a storage never written
    gets its zeros as a node of the current segment, not from a program call of its own
    (`torch.empty(...).fill_()`, `ones`, `ones_like`, `zeros`: a launch each, before the segment's
    one). The first call of a plan records the same segment as the later ones."""
    handle = t.untyped_storage().data_ptr()
    if handle and handle not in _buffers and deferred._mode["fused"] and not deferred.capturing():
        dtype = to_jax(t.dtype)
        index = t.device.index
        maker = _zeros_maker(t.untyped_storage().nbytes() // np.dtype(dtype).itemsize, np.dtype(dtype), index)
        buf = deferred.record(maker, [], index)[0]
        bind(handle, buf)
        return buf
    return buffer_of(t)


def new_tensor(prototype: torch.Tensor, shape, stride, buf: jax.Array) -> torch.Tensor:
    """A fresh tensor of `prototype`'s dtype and device (an empty tensor: cheap to copy from)
    whose storage holds `buf`, laid out densely as (shape, stride)."""
    t = prototype.new_empty_strided(shape, stride)
    if buf.shape[0]:  # a fresh tensor starts at offset 0: its data pointer is its storage's
        bind(t.data_ptr(), buf)
    return t


def keep_recent(outputs) -> None:
    """Remember a call's outputs for synchronize() (only where calls return before their work
    is done, KEEP_RECENT)."""
    recent.append(outputs)


def take_recent_outputs() -> list[jax.Array]:
    """The kept outputs of recent calls that no later call donated, forgotten here: synchronize
    waits for each once (a compiled training step keeps hundreds, which every later synchronize
    waited for again while they stayed among the latest 32 calls)."""
    taken = []
    while recent:
        taken += [a for a in recent.popleft() if not a.is_deleted()]
    return taken


def take_unsynced(device=None) -> list[jax.Array]:
    """The buffers of storages written since the last call (synchronize waits for them), pending
    ones computed first; with `device` (a jax device), only those on it (the rest stay unsynced)."""
    deferred.flush("synchronize")
    with _drain_lock:
        # Arrays only: a value another thread recorded since the flush is not dispatched yet (its
        # storage stays unsynced). Not clear(): another thread may have bound since.
        taken, buffers = [], []
        for handle in list(_unsynced):
            buf = _buffers.get(handle)
            if buf is None:
                taken.append(handle)
            elif type(buf) is not deferred.Pending and (device is None or device in buf.devices()):
                taken.append(handle)
                buffers.append(buf)
        _unsynced.difference_update(taken)
        return buffers


def bitcast(array: jax.Array, dtype) -> jax.Array:
    """Reinterpret a flat buffer's bytes as another dtype (view(dtype), set_ across dtypes)."""
    src, dst = np.dtype(array.dtype), np.dtype(dtype)
    if src == dst:
        return array
    if src == np.bool_:
        array, src = array.astype(jnp.uint8), np.dtype(np.uint8)
    if dst == np.bool_:
        return bitcast(array, jnp.uint8).astype(jnp.bool_)
    # XLA bitcasts no complex values: go through (real, imag) pairs of the component float type
    if src.kind == "c":
        return bitcast(jnp.stack([array.real, array.imag], -1).reshape(-1), dst)
    if dst.kind == "c":
        pairs = bitcast(array, np.dtype(f"f{dst.itemsize // 2}"))
        pairs = pairs[: pairs.shape[0] // 2 * 2].reshape(-1, 2)
        return jax.lax.complex(pairs[:, 0], pairs[:, 1])
    if src.itemsize == dst.itemsize:
        return jax.lax.bitcast_convert_type(array, dst)
    if src.itemsize > dst.itemsize:
        return jax.lax.bitcast_convert_type(array, dst).reshape(-1)
    ratio = dst.itemsize // src.itemsize
    usable = array.shape[0] // ratio * ratio
    return jax.lax.bitcast_convert_type(array[:usable].reshape(-1, ratio), dst)


# Zeros and widened buffers are made by a program per length, compiled at the second request of a
# length: the first is served from the host. A program per length (36 ms to compile, about 1.5 MB
# resident on XLA:CPU) would otherwise be paid for each new length of shapes that keep changing (an
# upload of each length that an eager op runs bucketed is widened to its bucket's room first).
_ASKED_ONCE = tables.BoundedTable("lengths asked once", 4096)
# (larger buffers take their program: copying them on the host costs more than a compile)
_HOST_BYTES = 16 << 20


def _first_request(key, nbytes: int) -> bool:
    """Whether `key` (a program and its lengths) is asked for the first time (now noted), for a
    buffer small enough to make on the host."""
    if nbytes > _HOST_BYTES or key in _ASKED_ONCE:
        return False
    _ASKED_ONCE.add(key, True)
    return True


def zeros(length: int, dtype, device_index: int) -> jax.Array:
    """A flat buffer of zeros on a NeuronCore: a length asked for again is made by a cached
    executable (about 8 µs, where host zeros and a device_put take tens to hundreds)."""
    dtype = np.dtype(dtype)
    if _first_request(("zeros", length, dtype, device_index), length * dtype.itemsize):
        return jax.device_put(np.zeros(length, dtype), devices.jax_device(device_index))
    return _zeros_maker(length, dtype, device_index)()


@functools.lru_cache(maxsize=1024)
def _zeros_maker(length: int, dtype: np.dtype, device_index: int):
    # named: a warm process loads it from the persistent cache untraced (onto its device)
    return executables.Function(lambda: jnp.zeros((length,), dtype), "runtime", "zeros",
                                identity=repr(("zeros", length, dtype.str)),
                                device=devices.jax_device(device_index))


def widened(array: jax.Array, length: int) -> jax.Array:
    """`array` with zeros appended up to `length` elements: a storage grown (`fit`), or a buffer
    given room past its bytes (eager bucketing). A pair of lengths asked for again is a cached
    executable; the first request, where buffers live in host memory, is widened there (waiting
    for the array's value)."""
    have, dtype = array.shape[0], np.dtype(array.dtype)
    if devices.HOST_MEMORY and _first_request(("widen", have, length, dtype), length * dtype.itemsize):
        host = np.zeros(length, dtype)
        host[:have] = np.asarray(array)
        return jax.device_put(host, array.sharding)
    return _widener(have, length, dtype)(array)


@functools.lru_cache(maxsize=256)
def _widener(have: int, length: int, dtype: np.dtype):
    return executables.Function(lambda buf: jnp.pad(buf, (0, length - have)), "runtime", "widen",
                                identity=repr(("widen", have, length, dtype.str)))


for _name, _maker in (("zeros programs", _zeros_maker), ("widen programs", _widener)):
    tables.register(_name, lambda maker=_maker: maker.cache_info().currsize, _maker.cache_info().maxsize)


def fit(array: jax.Array | None, dtype, length: int, device_index: int) -> jax.Array:
    """The buffer as exactly `length` elements of `dtype` (zeros where never written)."""
    if array is None:
        return zeros(length, dtype, device_index)
    if array.dtype != dtype:
        array = bitcast(array, dtype)
    have = array.shape[0]
    if have < length:
        array = widened(array, length)
    elif have > length:
        array = array[:length]
    return array


deferred.BEFORE_FLUSH.append(drain)
deferred.AFTER_FLUSH.append(_take_computed)
