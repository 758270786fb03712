"""Runs one ATen call on neuron: describe the call, find (or build) its plan, execute it.

A plan is built once per call signature (op, tensor layouts, dtypes, which arguments share a
storage, static arguments). Building it runs the op's meta kernel on meta tensors that share
storages the way the real arguments do: that yields PyTorch's own errors, result layouts and
out= resizes. Executing it is one jit-compiled call that reads every input from its storage
buffer, computes with the lowering, and returns the new buffers of written storages and the
fresh outputs' buffers.
"""
from __future__ import annotations

import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..lowering import LOWERINGS, META_OVERRIDES, Lowering, calling
from ..runtime import devices, storages
from ..runtime.core import urgent
from ..runtime.dtypes import UnsupportedDtypeError, to_jax
from . import overlap
from .layout import Layout, apply_math_bits, flatten, read, write
from .schema import Kind, OpSchema

warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
NEURON = "privateuseone"
_lock = threading.RLock()


class CallDescription:
    """The tensors and traced scalars of one call, its cache key, and the buffers it reads:
    one per distinct storage, in order of first use (a storage without a handle is its own)."""

    __slots__ = ("buffers", "handles", "index", "key", "math_bits", "missing", "scalars", "sharing",
                 "tensors")

    def __init__(self, math_bits: bool):
        self.key = []
        self.tensors = []
        self.scalars = []
        self.index = _NO_DEVICE  # the neuron device's index, once a neuron tensor is seen
        self.handles = []
        self.buffers = []
        self.missing = False  # a storage never written: its buffer is materialised on use
        self.sharing = {}  # storage handle -> first tensor using it: aliasing, not addresses, keys a plan
        self.math_bits = math_bits  # whether the op can receive conj/neg-bit views at all

    @property
    def device(self) -> torch.device | None:
        return None if self.index == _NO_DEVICE else torch.device(NEURON, self.index)


_NO_DEVICE = -2  # (get_device() says -1 for CPU tensors)
_BUFFERS = storages.buffers  # (the one table, never rebound: a global read, not an attribute's)
_KEEP_RECENT = storages.KEEP_RECENT  # (read per op: a global, not an attribute)


def _device_error(op, a: torch.device, b: torch.device) -> RuntimeError:
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
            return False
        if desc.index != _NO_DEVICE:
            raise _device_error(op, desc.device, dev)
        raise _device_error(op, dev, torch.device(NEURON, torch.neuron.current_device()))
    if desc.index != _NO_DEVICE:
        raise _device_error(op, desc.device, t.device)
    desc.index = index
    return True


def _add_tensor(desc: CallDescription, t: torch.Tensor, op) -> None:
    index = t.get_device()  # an int: cheaper to read and compare than a torch.device
    if index != desc.index and not _first_or_foreign(desc, t, index, op):
        return
    # This runs for every tensor of every op: one pass, no helper calls on the common path.
    offset = t.storage_offset()
    handle = t.untyped_storage().data_ptr()  # one call, where data_ptr needs offset and item size
    tensors = desc.tensors
    i = len(tensors)
    tensors.append(t)
    desc.handles.append(handle)
    first = desc.sharing.setdefault(handle, i) if handle else i
    if first == i:
        buf = storages.buffers.get(handle) if handle else None
        if buf is None:
            desc.missing = True
        desc.buffers.append(buf)
    # Conj and neg bits: PyTorch's math-bit fallbacks pass some ops (copy_, clone, mm...) such
    # views as they are, and expect the kernel to read and write the values they mean. Other ops
    # only ever see resolved tensors.
    if desc.math_bits:
        desc.key.append((t.shape, t.stride(), offset, t.dtype, first, t.is_conj(), t.is_neg()))
    else:
        desc.key.append((t.shape, t.stride(), offset, t.dtype, first, False, False))


def _run_tensors(schema: OpSchema, plans: dict, args):
    """The common call in one pass: positional tensors only, on one neuron device, every storage
    already written. Returns None, having run nothing, for any other call or a call without a
    plan yet: `describe` handles those (and raises their errors). The key is the one `describe`
    and `plan_key` build, so both paths share plans."""
    key, handles, found = [], [], []
    table = _BUFFERS
    index = _NO_DEVICE
    bits = schema.math_bits
    for t in args:
        if not isinstance(t, torch.Tensor):  # (parameters included)
            return None
        i = t.get_device()
        if i != index:
            if index != _NO_DEVICE or i < 0:
                return None
            index = i
        handle = t.untyped_storage().data_ptr()
        n = len(handles)
        # a few tensors: a scan finds a shared storage sooner than a dict is built
        first = handles.index(handle) if handle and handle in handles else n
        handles.append(handle)
        if first == n:
            buf = table.get(handle)
            if buf is None:
                return None
            found.append(buf)
        if bits:
            key.append((t.shape, t.stride(), t.storage_offset(), t.dtype, first, t.is_conj(), t.is_neg()))
        else:
            key.append((t.shape, t.stride(), t.storage_offset(), t.dtype, first, False, False))
    key.append(index)
    plan = plans.get(tuple(key))
    if plan is None:
        return None
    if plan.simple:
        return plan.run_buffers(found)
    desc = CallDescription(bits)
    desc.key, desc.handles, desc.buffers, desc.tensors, desc.index = key, handles, found, args, index
    for n, handle in enumerate(handles):
        if handle:
            desc.sharing.setdefault(handle, n)
    return plan.execute(args, {}, desc)


def describe(schema: OpSchema, args, kwargs) -> CallDescription:
    desc = CallDescription(schema.math_bits)
    op = schema.op
    for kind, value in zip(schema.kinds, args):
        if kind is Kind.TENSOR and isinstance(value, torch.Tensor):
            _add_tensor(desc, value, op)  # the common case, without the kind dispatch
        else:
            _describe_one(desc, kind, value, op)
    if kwargs:
        key = desc.key
        for name, value in kwargs.items():
            key.append(name)
            _describe_one(desc, schema.kind_by_name[name], value, op)
    return desc


def _describe_one(desc, kind, value, op) -> None:
    if kind is Kind.TENSOR:
        if isinstance(value, torch.Tensor):
            _add_tensor(desc, value, op)
        else:
            desc.key.append(value if value is None else ("py", type(value)))
            if value is not None:
                desc.scalars.append(value)
    elif kind is Kind.TENSORS:
        desc.key.append(len(value))
        for v in value:
            if v is None:
                desc.key.append(None)
            else:
                _add_tensor(desc, v, op)
    elif kind is Kind.SCALAR:
        if value is None:
            desc.key.append(None)
        elif isinstance(value, torch.Tensor):
            _add_tensor(desc, value, op)
        else:
            desc.key.append(type(value))
            desc.scalars.append(value)
    elif kind is Kind.SCALARS:
        desc.key.append(tuple(type(v) for v in value))
        desc.scalars.extend(value)
    else:
        desc.key.append(value if not isinstance(value, list) else tuple(value))


# torchneuron.profiler sets this to a function that says whether a profiler is recording.
profiling = None


def plan_key(schema: OpSchema, desc: CallDescription) -> tuple:
    """The device, layouts, dtypes, storage sharing and static arguments. Buffer dtypes and sizes
    are left out: they change no plan decision, and the plan's jit retraces for new buffer types itself."""
    key = (*desc.key, desc.index)  # a plan allocates its results on one device
    if desc.scalars:
        lowering = LOWERINGS.get(schema.functional)
        if lowering is not None and lowering.static_scalars:
            key += tuple(desc.scalars)  # the scalars shape the result: one plan per value
    return key


def run(schema: OpSchema, plans: dict, args, kwargs):
    """Every eager op's entry: the common call takes the one-pass path, the rest are described."""
    if profiling is not None and profiling():
        from ..profiler import profiled_run
        return profiled_run(schema, plans, args, kwargs)
    if urgent.value:  # storages.maybe_drain, without the call
        storages.drain()
    if not kwargs and len(args) <= schema.leading_tensors:
        result = _run_tensors(schema, plans, args)
        if result is not None:
            return result
    return _run_described(schema, plans, args, kwargs)


def run_plain(schema: OpSchema, plans: dict, args, kwargs):
    """`run` without the profiling check (the profiler's own call)."""
    if urgent.value:
        storages.drain()
    return _run_described(schema, plans, args, kwargs)


def _run_described(schema: OpSchema, plans: dict, args, kwargs):
    desc = describe(schema, args, kwargs)
    key = plan_key(schema, desc)
    plan = plans.get(key)
    if plan is None:
        with _lock:
            try:
                plan = Plan(schema, args, kwargs, desc, _buffers(desc))
            except UnsupportedDtypeError as e:
                raise UnsupportedDtypeError(e.dtype, str(schema.op)) from None
        if plan.resize:
            # out= arguments of the wrong size: resize them as PyTorch does, then run again.
            plan.apply_resizes(args, kwargs)
            return run_plain(schema, plans, args, kwargs)  # (the resizes' growths drained first)
        plans[key] = plan
    return plan.execute(args, kwargs, desc)


def _buffers(desc: CallDescription) -> list:
    """The call's buffers, with storages never written materialised as zeros."""
    buffers = desc.buffers
    if desc.missing:
        firsts = [i for i, h in enumerate(desc.handles) if not h or desc.sharing[h] == i]
        for k, i in enumerate(firsts):
            if buffers[k] is None:
                buffers[k] = _buffer_for(desc.tensors[i], desc.handles[i])
    return buffers


def _buffer_for(t: torch.Tensor, handle: int):
    buf = storages.buffers.get(handle)
    if buf is not None:
        return buf
    dtype = to_jax(t.dtype)  # never written: materialise as zeros
    buf = storages.fit(None, dtype, t.untyped_storage().nbytes() // jnp.dtype(dtype).itemsize,
                       t.device.index)
    if handle:
        storages.buffers[handle] = buf
    return buf


def _group_of(desc: CallDescription) -> list[int]:
    handles = desc.handles
    order: dict[int, int] = {}
    groups = []
    for i, h in enumerate(handles):
        if h == 0:
            groups.append(len(order) + 1000000 + i)
            continue
        groups.append(order.setdefault(h, len(order)))
    # renumber so groups index the buffer list
    remap = {g: i for i, g in enumerate(dict.fromkeys(groups))}
    return [remap[g] for g in groups]


class _Slot:
    """A placeholder in the argument template: the n-th tensor or scalar of the call."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


class Plan:
    def __init__(self, schema: OpSchema, args, kwargs, desc: CallDescription, buffers):
        self.schema = schema
        self.op = schema.op
        self.resize = []
        functional = schema.functional
        lowering = LOWERINGS.get(functional) if functional is not None else None
        if lowering is None:
            raise NotImplementedError(f"neuron has no lowering for {self.op}")
        self.lowering: Lowering = lowering
        self.groups = _group_of(desc)
        tensors = desc.tensors
        self.device = desc.device if desc.device is not None else _factory_device(kwargs)
        self.layouts = [Layout(tuple(t.shape), tuple(t.stride()), t.storage_offset()) for t in tensors]
        self._arg_slots = _slots_per_arg(
            list(enumerate(args)) + [(schema.names.index(k), v) for k, v in kwargs.items()])
        self.dtypes = [t.dtype for t in tensors]
        self.bits = [(t.is_conj(), t.is_neg()) for t in tensors]
        self.static_scalars = list(desc.scalars) if lowering.static_scalars else None

        meta_args, meta_kwargs, meta_tensors = self._meta_call(args, kwargs, buffers)
        self.template_args, self.template_kwargs = self._template(args, kwargs)
        if lowering.data_dependent:
            self.meta_out = None
        else:
            self.meta_out = self._run_meta(meta_args, meta_kwargs)
        # A meta kernel that cannot tell the output shape (x[mask]) makes this call data dependent.
        self.data_dependent = lowering.data_dependent or (self.meta_out is None and not schema.written)

        # out= tensors whose size the op changes are resized first (PyTorch's resize_output).
        for i, mt in enumerate(meta_tensors):
            if mt is not None and (tuple(mt.shape) != self.layouts[i].shape
                                   or tuple(mt.stride()) != self.layouts[i].stride):
                self.resize.append((i, tuple(mt.shape), tuple(mt.stride())))
        if self.resize:
            return

        self.writes = self._writes()  # [(tensor index, functional return path)]
        overlap.check(self.layouts, self.groups, {ti for ti, _ in self.writes},
                      [d.itemsize for d in self.dtypes])
        self.fresh = self._fresh()  # [(functional return path, Layout, dtype)]
        self.compute_dtype = self._compute_dtype(meta_args, meta_kwargs)
        # Layouts are part of the plan key, so flags derived from them are fixed per plan.
        self.layout_flags = calling.static_flags(functional, lowering, meta_args, meta_kwargs, self.meta_out)
        self.written_groups = sorted({self.groups[ti] for ti, _ in self.writes})
        self.read_groups = [g for g in range(len(buffers)) if g not in set(self.written_groups)]
        # For each written group, the position of one of its tensors (to find its handle per call).
        self.written_tensor = [self.groups.index(g) for g in self.written_groups]
        # Flat positional arguments: JAX dispatches them several microseconds faster than pytrees.
        n_written = len(self.written_groups)
        self.n_written = n_written
        self.arg_groups = self.written_groups + self.read_groups
        # The common call returns one fresh tensor: hand it back without assembling returns.
        single = (len(schema.return_aliases) == 1 and schema.return_aliases[0] is None
                  and [path for path, _, _ in self.fresh] == [(0,)])
        _, lay, dt = self.fresh[0] if single else (None, None, None)
        self.single_fresh = (lay.shape, lay.stride, torch.empty(0, dtype=dt, device=self.device),
                             lay.numel > 0) if single else None
        self.in_order = self.arg_groups == list(range(len(buffers)))
        self.random = lowering.random
        self.jitted = None if self.data_dependent else jax.jit(
            self._body, donate_argnums=tuple(range(n_written)))
        # The common call (nothing written, one fresh result, buffers in argument order) takes a
        # shorter path: eager speed is decided by these few microseconds.
        simple = (self.single_fresh is not None and not n_written and not self.random
                  and self.in_order and self.jitted is not None)
        self.simple = simple
        self.execute = self._execute_simple if simple else self.__call__

    # ------------------------------------------------------------ building
    def _meta_call(self, args, kwargs, buffers):
        """Args and kwargs with neuron tensors replaced by meta tensors sharing meta storages
        the way the real ones share storages."""
        metas = {}
        for g, buf in enumerate(buffers):
            metas[g] = torch.empty(buf.shape[0] * buf.dtype.itemsize, dtype=torch.uint8, device="meta")
        meta_tensors = [None] * len(self.layouts)
        counter = iter(range(len(self.layouts)))
        written_ids = set()
        for i in self.schema.written:
            v = args[i] if i < len(args) else kwargs.get(self.schema.names[i])
            for t in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(t, torch.Tensor):
                    written_ids.add(id(t))

        def convert(value):
            if isinstance(value, torch.Tensor):
                if value.device.type != "neuron":
                    return value
                i = next(counter)
                lay = self.layouts[i]
                m = torch.empty(0, dtype=self.dtypes[i], device="meta").set_(
                    metas[self.groups[i]].untyped_storage(), lay.offset, lay.shape, lay.stride)
                if id(value) in written_ids and self.schema.out_args:
                    meta_tensors[i] = m
                return m
            if isinstance(value, torch.device) and value.type == "neuron":
                return torch.device("meta")  # a factory's meta call must not dispatch to neuron again
            if isinstance(value, (list, tuple)):
                return type(value)(convert(v) for v in value)
            return value

        margs = [convert(a) for a in args]
        mkwargs = {k: convert(v) for k, v in kwargs.items()}
        return margs, mkwargs, meta_tensors

    def _run_meta(self, margs, mkwargs):
        missing = (NotImplementedError, torch._subclasses.fake_tensor.UnsupportedOperatorException)
        functional = self.schema.functional
        try:
            if self.op not in META_OVERRIDES and self.schema.out_args and functional in META_OVERRIDES:
                return self._run_meta_out(margs, mkwargs, META_OVERRIDES[functional])
            return META_OVERRIDES.get(self.op, self.op)(*margs, **mkwargs)
        except missing:
            if not self.schema.out_args or functional is None:
                return None
        try:  # an out= overload without a meta kernel: its functional's (histogram.bin_ct_out)
            return self._run_meta_out(margs, mkwargs, functional)
        except missing:
            return None

    def _run_meta_out(self, margs, mkwargs, functional_meta):
        """An out= overload whose functional has an override (or the only meta kernel): its results
        resize the out tensors as PyTorch's resize_output does."""
        names = self.schema.names
        out_names = {names[i] for i in self.schema.out_args}
        fargs = [a for i, a in enumerate(margs) if i not in self.schema.out_args]
        fkwargs = {k: v for k, v in mkwargs.items() if k not in out_names}
        results = functional_meta(*fargs, **fkwargs)
        results = results if isinstance(results, tuple) else (results,)
        outs = [margs[i] if i < len(margs) else mkwargs[names[i]] for i in self.schema.out_args]
        for out, result in zip(outs, results):
            if out.shape != result.shape:  # resized as the CPU kernel does: the result's layout
                out.resize_(result.shape).as_strided_(result.shape, result.stride())
        return tuple(outs) if len(outs) > 1 else outs[0]

    def _template(self, args, kwargs):
        counters = {"t": 0, "s": 0}

        def slot(kind, value):
            if kind is Kind.TENSORS:
                return [slot(Kind.TENSOR, v) for v in value]
            if kind is Kind.SCALARS:
                return [slot(Kind.SCALAR, v) for v in value]
            if kind in (Kind.TENSOR, Kind.SCALAR):
                if value is None:
                    return None
                if isinstance(value, torch.Tensor) and value.device.type == "neuron":
                    counters["t"] += 1
                    return _Slot(counters["t"] - 1)
                counters["s"] += 1  # a traced scalar (or a 0-dim CPU tensor taking part as one)
                return _Slot(-counters["s"])
            return value

        names = self.schema.names
        written = set(self.schema.out_args)
        targs = [slot(self.schema.kinds[i], a) for i, a in enumerate(args)]
        tkwargs = {}
        for k, v in kwargs.items():
            s = slot(self.schema.kind_by_name[k], v)
            if names.index(k) not in written:
                tkwargs[k] = s
        targs = [a for i, a in enumerate(targs) if i not in written]
        return targs, tkwargs

    def _writes(self):
        schema = self.schema
        writes = []
        if schema.out_args:
            for ret, i in enumerate(schema.out_args):
                writes += [(ti, (ret,)) for ti in self._arg_slots[i]]
        elif schema.written and schema.functional is not schema.op:
            name = schema.op._schema.name
            if name.endswith("_") and schema.written == [0]:
                slots = self._arg_slots[0]
                listy = schema.kinds[0] is Kind.TENSORS
                writes += [(ti, (0, j) if listy else (0,)) for j, ti in enumerate(slots)]
            else:  # _functional variant: fresh returns first, then the written args' new values
                n_fresh = len([a for a in schema.return_aliases if a is None])
                for k, i in enumerate(schema.written):
                    writes += [(ti, (n_fresh + k,)) for ti in self._arg_slots[i]]
        return writes

    def _fresh(self):
        schema = self.schema
        fresh = []
        if self.data_dependent:
            return fresh
        outs = self.meta_out
        if not isinstance(outs, (tuple, list)) or len(schema.op._schema.returns) == 1:
            outs = (outs,)
        for r, alias in enumerate(schema.return_aliases):
            if alias is not None:
                continue
            out = outs[r]
            if isinstance(out, (list, tuple)):
                for j, o in enumerate(out):
                    fresh.append(((r, j), Layout(tuple(o.shape), tuple(o.stride()), 0), o.dtype))
            elif isinstance(out, torch.Tensor):
                fresh.append(((r,), Layout(tuple(out.shape), tuple(out.stride()), 0), out.dtype))
            elif out is None and self.meta_out is None:
                raise NotImplementedError(f"neuron: no meta kernel for {self.op}")
            # else: an output the op leaves undefined (a backward's masked-out gradient): None
        return fresh

    def _compute_dtype(self, margs, mkwargs):
        return calling.compute_dtype(self.lowering, self.schema.names, margs, mkwargs)

    # ----------------------------------------------------------- executing
    def _call_lowering(self, values, scalars, rng):
        def fill(node):
            if isinstance(node, _Slot):
                if node.index >= 0:
                    return values[node.index]
                if self.static_scalars is not None:
                    return self.static_scalars[-node.index - 1]
                return scalars[-node.index - 1]
            if isinstance(node, list):
                return [fill(n) for n in node]
            return node

        call_args = [fill(node) for node in self.template_args]
        call_kwargs = {k: fill(node) for k, node in self.template_kwargs.items()}
        key = jax.random.fold_in(jax.random.key(rng[0]), rng[1]) if self.lowering.random else None
        return calling.invoke(self.schema.functional, self.lowering, call_args, call_kwargs,
                              self.compute_dtype, key, self.layout_flags)

    def _body(self, *flat):
        n_w, n_o = len(self.written_groups), len(self.read_groups)
        written, others = flat[:n_w], flat[n_w:n_w + n_o]
        scalars = flat[n_w + n_o:]
        rng = None
        if self.lowering.random:
            scalars, rng = scalars[:-2], scalars[-2:]
        buffers = [None] * (len(written) + len(others))
        for g, b in zip(self.written_groups, written):
            buffers[g] = b
        for g, b in zip(self.read_groups, others):
            buffers[g] = b
        values = self._read_all(buffers)
        scalars = [jnp.asarray(s) for s in scalars]
        results = self._call_lowering(values, scalars, rng)
        new = {}
        for ti, path in self.writes:
            g = self.groups[ti]
            buf = new.get(g, buffers[g])
            buf = storages.bitcast(buf, to_jax(self.dtypes[ti]))
            # storing x through a conj (neg) view stores conj(x) (-x): the bits are self-inverse
            new[g] = write(buf, self.layouts[ti], apply_math_bits(_at(results, path), self.bits[ti]))
        # An empty result takes no values: its meta layout may be empty where the lowering's is
        # not (eval batch norm's saved statistics).
        fresh = [jnp.zeros((0,), to_jax(dt)) if lay.numel == 0 else
                 flatten(jnp.broadcast_to(_at(results, path), lay.shape).astype(to_jax(dt)), lay)
                 for path, lay, dt in self.fresh]
        return (*[new[g] for g in self.written_groups], *fresh)  # flat: the fastest jit outputs

    def __call__(self, args, kwargs, desc: CallDescription):
        buffers = _buffers(desc) if desc.missing else desc.buffers
        rng = _next_rng(self.device, args, kwargs, self.schema) if self.random else None
        if self.jitted is None:
            return self._run_data_dependent(args, kwargs, desc, buffers, rng)
        flat = list(buffers) if self.in_order else [buffers[g] for g in self.arg_groups]
        if desc.scalars:
            flat += [_SCALAR_TYPES.get(type(v), np.asarray)(v) for v in desc.scalars]
        if rng is not None:
            flat += [np.uint64(rng[0]), np.uint64(rng[1])]
        outputs = self.jitted(*flat)
        if _KEEP_RECENT:
            storages.recent.append(outputs)
        n_written = self.n_written
        if n_written:
            handles = desc.handles
            table = storages.buffers
            for ti, buf in zip(self.written_tensor, outputs[:n_written]):
                if handles[ti]:
                    table[handles[ti]] = buf
        if self.single_fresh:
            return self._single_result(outputs[n_written])
        return self._results(args, kwargs, outputs[n_written:])

    def _execute_simple(self, args, kwargs, desc: CallDescription):
        flat = _buffers(desc) if desc.missing else desc.buffers
        if desc.scalars:
            flat = [*flat, *[_SCALAR_TYPES.get(type(v), np.asarray)(v) for v in desc.scalars]]
        return self.run_buffers(flat)

    def run_buffers(self, flat):
        """A simple plan's call on its argument buffers: one fresh result."""
        outputs = self.jitted(*flat)
        if _KEEP_RECENT:
            storages.recent.append(outputs)
        return self._single_result(outputs[0])

    def _single_result(self, buf):
        shape, stride, prototype, nonempty = self.single_fresh
        t = prototype.new_empty_strided(shape, stride)  # dtype and device from an empty prototype
        if nonempty:  # a fresh tensor starts at offset 0: its data pointer is its storage's
            _BUFFERS[t.data_ptr()] = buf
        return t

    def _results(self, args, kwargs, fresh_buffers):
        device = self.device
        made = []
        for (path, lay, dt), buf in zip(self.fresh, fresh_buffers):
            t = torch.empty_strided(lay.shape, lay.stride, dtype=dt, device=device)
            if t.numel():
                storages.buffers[t.data_ptr()] = buf
            made.append((path, t))
        return self._assemble(args, kwargs, made)

    def _assemble(self, args, kwargs, made):
        schema = self.schema
        returns = schema.op._schema.returns
        if not returns:
            return None
        by_return: dict[int, object] = {}
        for path, t in made:
            if len(path) == 2:
                by_return.setdefault(path[0], []).append(t)
            else:
                by_return[path[0]] = t
        out = []
        fresh_index = 0
        for r, alias in enumerate(schema.return_aliases):
            if alias is not None:
                name = schema.names[alias]
                out.append(args[alias] if alias < len(args) else kwargs[name])
            else:
                listy = str(returns[r].type).startswith("List")
                out.append(by_return.get(fresh_index, [] if listy else None))
                fresh_index += 1
        return out[0] if len(returns) == 1 else tuple(out)

    def apply_resizes(self, args, kwargs):
        flat = [t for t in _flat_tensors(args, kwargs) if t.device.type == "neuron"]
        for i, shape, stride in self.resize:
            t = flat[i]
            t.resize_(shape)
            if t.stride() != stride:
                t.as_strided_(shape, stride)

    def _read_all(self, buffers):
        """Every tensor argument's values: its layout read from its buffer, math bits applied."""
        return [apply_math_bits(read(storages.bitcast(buffers[g], to_jax(dt)), lay), bits)
                for g, dt, lay, bits in zip(self.groups, self.dtypes, self.layouts, self.bits)]

    def _run_data_dependent(self, args, kwargs, desc, buffers, rng):
        values = self._read_all(buffers)
        results = self._call_lowering(values, [jnp.asarray(s) for s in desc.scalars], rng)
        made = []
        for r, res in enumerate(results):
            res = jnp.asarray(res)
            t = torch.empty(res.shape, dtype=_torch_dtype(res.dtype), device=self.device)
            if t.numel():
                storages.buffers[t.data_ptr()] = jax.device_put(res.reshape(-1), devices.jax_device(
                    self.device.index))
            made.append(((r,), t))
        if self.schema.out_args:  # out= of a data-dependent op: resize the outs, then copy in
            names = self.schema.names
            outs = [args[i] if i < len(args) else kwargs[names[i]] for i in self.schema.out_args]
            return fill_outs(outs, [t for _, t in made])
        return self._assemble(args, kwargs, made)


def fill_outs(outs, results):
    """out= after the fact: each out resized to its result's shape (PyTorch's resize_output), then
    filled by a copy; returns the outs as the op returns them."""
    for out, result in zip(outs, results):
        if out.shape != result.shape:
            out.resize_(result.shape)
        out.copy_(result)
    return tuple(outs) if len(outs) > 1 else outs[0]


def _slots_per_arg(indexed_args) -> dict[int, list[int]]:
    """For each schema argument index, the indices of its neuron tensors among the call's tensors."""
    slots = {}
    counter = 0
    for i, value in indexed_args:
        mine = []
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, torch.Tensor) and v.device.type == "neuron":
                mine.append(counter)
                counter += 1
        slots[i] = mine
    return slots


# numpy scalars reach jitted code faster than Python numbers, with the same dtype PyTorch uses.
_SCALAR_TYPES = {float: np.float64, int: np.int64, bool: np.bool_, complex: np.complex128}


def _torch_dtype(dtype):
    from ..runtime.dtypes import to_torch
    return to_torch(dtype)


def _at(results, path):
    v = results[path[0]]
    return v[path[1]] if len(path) == 2 else v


def _flat_tensors(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, torch.Tensor):
                    yield x


def _factory_device(kwargs) -> torch.device:
    dev = kwargs.get("device")
    if dev is None:
        return torch.device("neuron", torch.neuron.current_device())
    dev = torch.device(dev)
    return dev if dev.index is not None else torch.device("neuron", torch.neuron.current_device())


def _next_rng(device, args, kwargs, schema):
    from ..random import next_seed_and_offset
    gen = kwargs.get("generator")
    if gen is None and "generator" in schema.names:
        i = schema.names.index("generator")
        gen = args[i] if i < len(args) else None
    return next_seed_and_offset(device, gen)
