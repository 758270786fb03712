"""Describing one call: its tensors, traced scalars, storages, and the key of its plan.

A plan is found by a key made of the call's device, each tensor's layout, dtype and storage
sharing (which earlier tensor shares its storage: aliasing, never addresses) and the static
arguments. `tensor_key` and `plan_key` are the one place that key is built; the driver's
one-pass path and `describe` both use them, so both find the same plans.
"""
from __future__ import annotations

import itertools
import operator
import warnings

import torch

from ..runtime import storages
from .schema import Kind, OpSchema

NEURON = "privateuseone"
NO_DEVICE = -2  # (get_device() says -1 for CPU tensors)
aten = torch.ops.aten

class CallDescription:
    """The tensors and traced scalars of one call, its cache key, and the buffers it reads:
    one per distinct storage, in order of first use (a storage without a handle is its own)."""

    __slots__ = ("buffers", "handles", "host_scalars", "index", "key", "math_bits", "missing", "scalars",
                 "shared", "sharing", "tensors")

    def __init__(self, math_bits: bool):
        self.key = []
        self.tensors = []
        self.scalars = []
        self.index = NO_DEVICE  # the neuron device's index, once a neuron tensor is seen
        self.handles = []
        self.buffers = []
        self.missing = False  # a storage never written: its buffer is materialised on use
        self.sharing = {}  # storage handle -> first tensor using it: aliasing, not addresses, keys a plan
        self.shared = False  # whether two of its tensors share a storage
        self.host_scalars = False  # whether a 0-dim CPU tensor takes part as a scalar
        self.math_bits = math_bits  # whether the op can receive conj/neg-bit views at all

    @property
    def device(self) -> torch.device | None:
        return None if self.index == NO_DEVICE else torch.device(NEURON, self.index)


def tensor_key(t: torch.Tensor, first: int, math_bits: bool) -> tuple:
    """A tensor's part of a plan key: layout, dtype, the first tensor of the call sharing its
    storage, and (for ops that receive them) its conj and neg bits. The storage offset is only
    told apart as zero or not: a plan reads and writes a view at any other offset through a traced
    offset (`x[i]` in a loop runs one executable), unless the call shares a storage between its
    tensors, where `shared_offsets` adds every offset to the key (aliasing depends on them)."""
    offset = TRACED_OFFSET if t.storage_offset() else 0
    if math_bits:
        return (t.shape, t.stride(), offset, t.dtype, first, t.is_conj(), t.is_neg())
    return (t.shape, t.stride(), offset, t.dtype, first, False, False)


TRACED_OFFSET = -1  # a plan key's offset of a view not at its storage's start
_current_device = torch._C._accelerator_hooks_get_current_device


def is_tensor_entry(entry) -> bool:
    """Whether a plan key entry is a tensor's (tensor_key's tuple)."""
    return type(entry) is tuple and len(entry) == 7 and type(entry[0]) is torch.Size


def shared_offsets(tensors) -> tuple:
    """The key entry of a call whose tensors share a storage: every neuron tensor's offset."""
    return ("offsets", tuple(t.storage_offset() for t in tensors))


def plan_key(schema: OpSchema, entries: list, index: int, scalars=()) -> tuple:
    """The plan key from the tensors' and static arguments' entries and the device index. Buffer
    dtypes and sizes are left out: they change no plan decision, and the plan's jit retraces for
    new buffer types itself."""
    # a plan allocates its results on one device: a call without neuron tensors (a factory whose
    # device is "neuron", no index) on the current one
    key = (*entries, index if index != NO_DEVICE else ("current", _current_device()))
    if scalars and schema.static_scalars:
        key += tuple(scalars)  # the scalars shape the result: one plan per value
    return key


def key_of(schema: OpSchema, desc: CallDescription) -> tuple:
    return plan_key(schema, desc.key, desc.index, desc.scalars)


def move_host_operands(schema: OpSchema, args, kwargs) -> tuple:
    """`args` and `kwargs` with the CPU tensors of the arguments the op's record names (host_operands)
    moved to self's neuron device (one transfer each, once per call), byte masks made bool masks
    with CPU's warning, each call; unchanged for other ops."""
    names = schema.host_operands
    if not names or not args or not isinstance(args[0], torch.Tensor) or args[0].device.type != "neuron":
        return args, kwargs  # (self on CPU: the same-device error follows from `describe`)
    device = args[0].device

    def moved(value):
        if isinstance(value, torch.Tensor):
            value = value.to(device) if value.device.type == "cpu" else value
            if value.dtype == torch.uint8:  # a byte index is a mask, deprecated (ATen's expandTensors)
                warnings.warn("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool "
                              "instead.", stacklevel=2)
                value = value.bool()
            return value
        if isinstance(value, (list, tuple)):
            return [moved(v) for v in value]
        return value

    args = list(args)
    kwargs = dict(kwargs)
    for name in names:
        i = schema.names.index(name)
        if i < len(args):
            args[i] = moved(args[i])
        elif name in kwargs:
            kwargs[name] = moved(kwargs[name])
    return tuple(args), kwargs


def device_error(op, a: torch.device, b: torch.device) -> RuntimeError:
    """The error of a call mixing devices a and b, in PyTorch's words."""
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {a} and {b}! "
        f"(when checking argument for {op})")


def _first_or_foreign(desc: CallDescription, t: torch.Tensor, index: int, op) -> bool:
    """A tensor on another device than the call's so far: the call's first neuron tensor (True),
    a 0-dim CPU tensor taking part as a scalar (False), or a device mix (raises)."""
    if index < 0:
        dev = t.device
        if t.dim() == 0 and dev.type == "cpu":
            # PyTorch lets 0-dim CPU tensors take part as scalars in device ops.
            desc.key.append(("cpu", t.dtype))
            desc.scalars.append(t.item())
            desc.host_scalars = True
            return False
        if desc.index != NO_DEVICE:
            raise device_error(op, desc.device, dev)
        raise device_error(op, dev, torch.device(NEURON, torch.neuron.current_device()))
    if desc.index != NO_DEVICE:
        raise device_error(op, desc.device, t.device)
    desc.index = index
    return True


_lookup = storages.lookup


def _add_tensors(desc: CallDescription, values, op) -> None:
    """Each tensor's entry (None for a None element): its index, storage handle, the buffer of a
    storage first seen, and its key. One loop with its names bound once: foreach ops (an
    optimizer step's) pass lists of tens of tensors."""
    key, tensors, handles, buffers, sharing = desc.key, desc.tensors, desc.handles, desc.buffers, desc.sharing
    math_bits = desc.math_bits
    for t in values:
        if t is None:
            key.append(None)
            continue
        index = t.get_device()  # an int: cheaper to read and compare than a torch.device
        if index != desc.index and not _first_or_foreign(desc, t, index, op):
            continue
        handle = t.untyped_storage().data_ptr()  # one call, where data_ptr needs offset and item size
        i = len(tensors)
        tensors.append(t)
        handles.append(handle)
        first = sharing.setdefault(handle, i) if handle else i
        if first == i:
            buf = _lookup(handle) if handle else None
            if buf is None:
                desc.missing = True
            buffers.append(buf)
        else:
            desc.shared = True
        # Conj and neg bits: PyTorch's math-bit fallbacks pass some ops (copy_, clone, mm...) such
        # views as they are, and expect the kernel to read and write the values they mean. Other ops
        # only ever see resolved tensors.
        key.append(tensor_key(t, first, math_bits))


# A foreach op's list (an optimizer step passes several of tens of tensors each): read field by
# field with map, which calls each tensor method from C, where _add_tensors' loop takes ~1.3 µs a
# tensor in Python.
_LIST_IN_BULK = 8
_get_device = torch.Tensor.get_device
_untyped_storage = torch.Tensor.untyped_storage
_data_ptr = torch.UntypedStorage.data_ptr
_stride = torch.Tensor.stride
_storage_offset = torch.Tensor.storage_offset
_shape = operator.attrgetter("shape")
_dtype = operator.attrgetter("dtype")
_NONE_TYPE = type(None)


def _add_tensor_list(desc: CallDescription, values) -> bool:
    """`_add_tensors` for a list of tensors on the call's neuron device, each with a storage of its
    own or one an earlier tensor of the call has; False, having added nothing, for any other list
    (a None, another device, a storage without bytes, conj or neg views): the loop takes those."""
    try:
        devices = set(map(_get_device, values))
    except TypeError:  # (a None element)
        return False
    if len(devices) != 1:
        return False
    (index,) = devices
    if index < 0 or (desc.index != NO_DEVICE and index != desc.index):
        return False
    if desc.math_bits and any(t.is_conj() or t.is_neg() for t in values):
        return False
    handles = list(map(_data_ptr, map(_untyped_storage, values)))
    if 0 in handles:
        return False
    desc.index = index
    tensors = desc.tensors
    start = len(tensors)
    tensors.extend(values)
    desc.handles.extend(handles)
    firsts = list(map(desc.sharing.setdefault, handles, range(start, start + len(handles))))
    found = list(map(_lookup, handles))
    if firsts == list(range(start, start + len(firsts))):  # (every storage new to the call)
        desc.buffers.extend(found)
    else:  # a storage met before: its first tensor's buffer only
        desc.shared = True
        desc.buffers.extend(buf for i, (first, buf) in enumerate(zip(firsts, found), start) if first == i)
    if _NONE_TYPE in set(map(type, found)):  # (not `None in found`: that compares arrays to None)
        desc.missing = True
    offsets = list(map(_storage_offset, values))
    if any(offsets):
        offsets = [TRACED_OFFSET if o else 0 for o in offsets]
    n = len(values)
    desc.key.extend(zip(map(_shape, values), map(_stride, values), offsets, map(_dtype, values), firsts,
                        itertools.repeat(False, n), itertools.repeat(False, n)))
    return True


def describe(schema: OpSchema, args, kwargs) -> CallDescription:
    desc = CallDescription(schema.math_bits)
    op = schema.op
    for kind, value in zip(schema.kinds, args):
        if kind is Kind.TENSOR and isinstance(value, torch.Tensor):
            _add_tensors(desc, (value,), op)  # the common case, without the kind dispatch
        else:
            _describe_one(desc, kind, value, op)
    if kwargs:
        key = desc.key
        for name, value in kwargs.items():
            key.append(name)
            _describe_one(desc, schema.kind_by_name[name], value, op)
    if desc.shared:
        desc.key.append(shared_offsets(desc.tensors))
    if schema.written and desc.host_scalars and desc.index != NO_DEVICE:
        _check_written_on_device(schema, args, kwargs, desc)
    return desc


def _check_written_on_device(schema: OpSchema, args, kwargs, desc: CallDescription) -> None:
    """A 0-dim CPU tensor takes part as a scalar only when read: one the op writes (an out=
    tensor, an in-place op's self) must be on the call's device, as CUDA requires."""
    for i in schema.written:
        value = args[i] if i < len(args) else kwargs.get(schema.names[i])
        for t in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(t, torch.Tensor) and t.get_device() < 0:
                raise device_error(schema.op, desc.device, t.device)


def _describe_one(desc, kind, value, op) -> None:
    if kind is Kind.TENSOR:
        if isinstance(value, torch.Tensor):
            _add_tensors(desc, (value,), op)
        else:
            desc.key.append(value if value is None else ("py", type(value)))
            if value is not None:
                desc.scalars.append(value)
    elif kind is Kind.TENSORS:
        desc.key.append(len(value))
        if len(value) < _LIST_IN_BULK or not _add_tensor_list(desc, value):
            _add_tensors(desc, value, op)
    elif kind is Kind.SCALAR:
        if value is None:
            desc.key.append(None)
        elif isinstance(value, torch.Tensor):
            _add_tensors(desc, (value,), op)
        else:
            desc.key.append(type(value))
            desc.scalars.append(value)
    elif kind is Kind.SCALARS:
        desc.key.append(tuple(type(v) for v in value))
        desc.scalars.extend(value)
    else:
        desc.key.append(value if not isinstance(value, list) else tuple(value))


def buffers_of(desc: CallDescription, run: bool = False) -> list:
    """The call's buffers, one per storage, with storages never written materialised as zeros
    (`run`: for the call about to run, where fused eager records the zeros in its segment)."""
    buffers = desc.buffers
    if desc.missing:
        materialise = storages.buffer_for_call if run else storages.buffer_of
        firsts = [i for i, h in enumerate(desc.handles) if not h or desc.sharing[h] == i]
        for k, i in enumerate(firsts):
            if buffers[k] is None:
                buffers[k] = materialise(desc.tensors[i])
    return buffers
