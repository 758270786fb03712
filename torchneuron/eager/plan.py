"""Building a plan: what one call signature of an op does, decided once.

Building runs the op's meta kernel on meta tensors that share storages the way the real
arguments do: that yields PyTorch's own errors, result layouts and out= resizes. From it the
plan knows which storages it writes, which fresh outputs it makes, the lowering's argument
template and the jit-compiled body that `execute.PlanExecution` calls.
"""
from __future__ import annotations

import functools
import inspect

import torch
from torch._decomp import meta_table

from .. import config
from ..lowering import Lowering, calling, check_refusals, draws_random, record_of
from ..runtime import devices, executables, tables
from ..runtime.dtypes import scalar_type_name
from ..runtime.layout import Layout, canonical_stride, contiguous_stride
from . import overlap, plan_store
from .describe import TRACED_OFFSET, CallDescription, is_tensor_entry, key_of
from .execute import PlanExecution, Slot
from .schema import Kind, OpSchema


def _fresh_layout(out: torch.Tensor) -> Layout:
    """A fresh result's layout: the meta kernel's strides where they describe a dense block, else
    contiguous (the functional `aten.copy` of a sliced `self` keeps its gapped strides on CPU; a
    fresh buffer holds just the elements)."""
    lay = Layout(tuple(out.shape), tuple(out.stride()), 0)
    if lay.numel and lay.dense_order() is None:
        return Layout(lay.shape, contiguous_stride(lay.shape), 0)
    return lay


# a program's identity -> its Function, shared by every plan of that program; it goes when the
# cache evicts the program's executables, or past the limit (its plans keep it; a new plan of the
# same identity makes a new Function, which loads the program again)
_PROGRAMS = tables.BoundedTable("eager programs", 8192)


def _program(identity, make) -> executables.Function:
    """The Function of the plans whose programs are named `identity`, made by `make` the first time."""
    if identity is None:
        return make()
    function = _PROGRAMS.get(identity)
    if function is None:
        function = make()
        _PROGRAMS.add(identity, function)
        executables.when_empty(function, functools.partial(_PROGRAMS.discard, identity, function))
    return function


def _canonical(lay: Layout) -> Layout:
    return lay._replace(stride=canonical_stride(lay.shape, lay.stride))


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


class Plan(PlanExecution):
    """What one call signature of an op does; built once, executed for every such call."""

    def __init__(self, schema: OpSchema, args, kwargs, desc: CallDescription, buffers):
        self.schema = schema
        self.op = schema.op
        self.resize = []
        lowering = record_of(schema.functional).lowering
        if lowering is None:
            raise NotImplementedError(f"neuron has no lowering for {self.op}")
        self.lowering: Lowering = lowering
        self._read_call(schema, args, kwargs, desc)
        # (on the call's own tensors: their dtypes and shapes are the meta ones, and a plan read
        # back from the store is checked too)
        check_refusals(self.op, args, kwargs)
        # What the meta kernel tells follows from the plan key: a later process reads it back.
        stored_key = plan_store.key_for(schema, desc, lowering)
        record = plan_store.load(stored_key)
        if record is None:
            meta_args, meta_kwargs = self._run_meta(args, kwargs, buffers)
            if self.resize:  # (never kept: a call that resizes runs the meta kernel, and its warning, each time)
                return
        else:
            self.meta_out, self.data_dependent = None, False

        self.writes = self._writes()  # [(tensor index, functional return path)]
        overlap.check(self.layouts, self.groups, {ti for ti, _ in self.writes},
                      [d.itemsize for d in self.dtypes])
        if record is None:
            self._decide_results(meta_args, meta_kwargs)
        else:
            self.fresh, self.int_results, self.compute_dtype, self.layout_flags, identity = record
        self._arrange_buffers(len(buffers))
        self._arrange_returns()
        self.random = draws_random(lowering, schema.functional, self.template_args, self.template_kwargs)
        # the lowering checks conditions on the device: the device's failure word goes through the call
        self.checked = lowering.checks and config.DEVICE_ASSERTS
        # compiled per buffer signature, its executables in the runtime's bounded cache; unnamed
        # (never loaded untraced, never shared): user code, which the name cannot cover
        if record is None:
            identity = None if lowering.user_code else self._identity(schema, desc)
            if not self.data_dependent:
                plan_store.store(stored_key, (self.fresh, self.int_results, self.compute_dtype, self.layout_flags,
                                              identity))
        # Results on the plan's device, always: a program whose arguments hold no device array (a
        # factory: `arange`, `full`) or whose only one goes unread (`zero_`, `fill_`: XLA drops it)
        # would otherwise run on the first core. (A plan's name holds its device.)
        self.function = None if self.data_dependent else _program(identity, lambda: executables.Function(
            self._body, "eager", str(self.op), donate_argnums=tuple(range(self.n_written)), identity=identity,
            device=devices.jax_device(self.device.index)))
        # The common call (nothing written, one fresh result, buffers in argument order) takes a
        # shorter path: eager speed is decided by these few microseconds.
        self.simple = (self.single_fresh is not None and not self.n_written and not self.random
                       and self.in_order and self.function is not None and not self.traced_offsets
                       and not self.traced_strides)
        self.execute = self._execute_simple if self.simple else self.__call__

    def _read_call(self, schema: OpSchema, args, kwargs, desc: CallDescription) -> None:
        """What the call's arguments fix: its device, its tensors' layouts, dtypes and storage groups,
        which offsets and strides the program takes as arguments, and the template of its arguments."""
        self.groups = _group_of(desc)
        tensors = desc.tensors
        self.device = desc.device if desc.device is not None else _factory_device(kwargs)
        self.device_index = self.device.index  # (read per call: an int, not a device's attribute)
        self.layouts = [Layout(tuple(t.shape), tuple(t.stride()), t.storage_offset()) for t in tensors]
        # Views away from their storage's start, in storages no other tensor of the call uses: their
        # offsets are the program's arguments (the key does not hold them: describe.tensor_key).
        shared = {g for g in self.groups if self.groups.count(g) > 1}
        self.traced_offsets = [i for i, lay in enumerate(self.layouts) if lay.offset and self.groups[i] not in shared]
        # Gapped views (`ids[:, -1:]` of a growing batch: row stride n) in such storages: read and
        # written by a gather over traced strides, so plans for each stride share one program (the
        # key keeps the strides: PyTorch's result layouts can depend on them).
        self.traced_strides = [i for i, lay in enumerate(self.layouts)
                               if lay.numel > 1 and lay.dense_order() is None and self.groups[i] not in shared]
        self._arg_slots = _slots_per_arg(
            list(enumerate(args)) + [(schema.names.index(k), v) for k, v in kwargs.items()])
        self.dtypes = [t.dtype for t in tensors]
        self.bits = [(t.is_conj(), t.is_neg()) for t in tensors]
        self.static_scalars = list(desc.scalars) if self.lowering.static_scalars else None
        self.template_args, self.template_kwargs = template_of(schema, args, kwargs)

    def _run_meta(self, args, kwargs, buffers):
        """Run the meta kernel: the outputs' shapes (meta_out), whether the call is data dependent,
        and the out= tensors to resize first. Returns the meta call's (args, kwargs)."""
        meta_args, meta_kwargs, meta_tensors = self._meta_call(args, kwargs, buffers)
        if self.lowering.data_dependent:
            self.meta_out = None
            meta = record_of(self.op).meta
            if meta is not None:  # for a data-dependent op, a check of its arguments
                meta(*meta_args, **meta_kwargs)
        else:
            self.meta_out = self._meta_outputs(meta_args, meta_kwargs)
        # A meta kernel that cannot tell the output shape (x[mask]) makes this call data dependent
        # (an op that returns nothing, an assert checked on the device, is not).
        self.data_dependent = self.lowering.data_dependent or (
            self.meta_out is None and not self.schema.written and bool(self.schema.list_returns))
        # out= tensors whose size the op changes are resized first (PyTorch's resize_output).
        for i, mt in enumerate(meta_tensors):
            if mt is not None and (tuple(mt.shape) != self.layouts[i].shape
                                   or tuple(mt.stride()) != self.layouts[i].stride):
                self.resize.append((i, tuple(mt.shape), tuple(mt.stride())))
        return meta_args, meta_kwargs

    def _decide_results(self, meta_args, meta_kwargs) -> None:
        """From the meta call: the fresh results, integer results, the dtype to compute in and the
        lowering's layout flags (what a stored plan holds)."""
        self.fresh = self._fresh()  # [(functional return path, Layout, dtype)]
        # Integer results (fused attention's max_q/max_k) follow from the key: the meta kernel's.
        self.int_results = self._int_results()
        self.compute_dtype = self._compute_dtype(meta_args, meta_kwargs)
        # Layouts are part of the plan key, so flags derived from them are fixed per plan.
        self.layout_flags = calling.static_flags(self.schema.functional, self.lowering, meta_args, meta_kwargs,
                                                 self.meta_out)

    def _arrange_buffers(self, n_buffers: int) -> None:
        """The program's arguments: the written storages' buffers first (donated), then the read ones."""
        self.written_groups = sorted({self.groups[ti] for ti, _ in self.writes})
        self.read_groups = [g for g in range(n_buffers) if g not in set(self.written_groups)]
        # For each written group, the position of one of its tensors (to find its handle per call).
        self.written_tensor = [self.groups.index(g) for g in self.written_groups]
        # Flat positional arguments: JAX dispatches them several microseconds faster than pytrees.
        self.n_written = len(self.written_groups)
        self.arg_groups = self.written_groups + self.read_groups
        self.in_order = self.arg_groups == list(range(n_buffers))

    def _arrange_returns(self) -> None:
        """How results come back: prototypes of the fresh tensors, and the two common shapes of returns
        that skip assembling them."""
        # empty tensors of each fresh output's dtype and device: new tensors are made from them
        self.fresh_prototypes = [torch.empty(0, dtype=dt, device=self.device) for _, _, dt in self.fresh]
        returns = self.schema.return_aliases
        # The common call returns one fresh tensor: hand it back without assembling returns.
        single = (len(returns) == 1 and returns[0] is None and [path for path, _, _ in self.fresh] == [(0,)])
        lay = self.fresh[0][1] if single else None
        self.single_fresh = (lay.shape, lay.stride, self.fresh_prototypes[0], lay.numel > 0) if single else None
        # Every return a fresh tensor, in order (layer norm's output, mean and rstd): returned as made.
        self.fresh_in_order = (len(returns) > 1 and all(alias is None for alias in returns) and not self.int_results
                               and [path for path, _, _ in self.fresh] == [(r,) for r in range(len(returns))])

    def _identity(self, schema: OpSchema, desc: CallDescription) -> str:
        """Everything this plan's program depends on besides its buffers, as text: the op, its key
        and what the plan decided from them (the persistent cache's name for the program, and
        plans with equal names share one program). Strides of size-1 dimensions are left out: no
        read or write depends on them, though PyTorch's result strides can (`x[:, -1:].clone()`
        keeps its row stride), so `input_ids[:, -1:]` of a growing batch plans anew, cheaply, but
        compiles once."""
        layouts = [_canonical(lay._replace(offset=TRACED_OFFSET) if i in self.traced_offsets else lay)
                   for i, lay in enumerate(self.layouts)]
        for i in self.traced_strides:
            layouts[i] = layouts[i]._replace(stride=TRACED_OFFSET)
        key, i = [], 0
        for e in key_of(schema, desc):
            if is_tensor_entry(e):
                stride = TRACED_OFFSET if i in self.traced_strides else canonical_stride(e[0], e[1])
                key.append((e[0], stride, *e[2:]))
                i += 1
            else:
                key.append(e)
        fresh = [(path, _canonical(lay), dtype) for path, lay, dtype in self.fresh]
        return repr((str(self.op), key, self.groups, layouts, self.dtypes, self.bits,
                     self.template_args, self.template_kwargs, self.writes, fresh, self.compute_dtype,
                     self.layout_flags, self.checked, self.random))

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
                    # a 0-dim CPU tensor, a scalar to the op: type promotion treats 0-dim tensors
                    # alike on any device, and a meta one passes the meta kernel's device checks
                    return torch.empty((), dtype=value.dtype, device="meta") if value.dim() == 0 else value
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

    def _meta_outputs(self, margs, mkwargs):
        missing = (NotImplementedError, torch._subclasses.fake_tensor.UnsupportedOperatorException)
        functional = self.schema.functional
        try:
            own_meta, functional_meta = record_of(self.op).meta, record_of(functional).meta
            if self.schema.out_args and self.lowering.promote is not None and own_meta is None:
                self._check_out_casts(margs, mkwargs, functional_meta or functional)
            if own_meta is None and self.schema.out_args and (
                    functional_meta is not None or not _meta_takes(self.op, margs, mkwargs)):
                return self._meta_of_out_overload(margs, mkwargs, functional_meta or functional)
            return (own_meta or self.op)(*margs, **mkwargs)
        except missing:
            if not self.schema.out_args or functional is None:
                return None
        try:  # an out= overload without a meta kernel: its functional's (histogram.bin_ct_out)
            return self._meta_of_out_overload(margs, mkwargs, functional)
        except missing:
            return None

    def _functional_results(self, margs, mkwargs, functional_meta) -> tuple:
        """(results of an out= overload's functional on the meta arguments, the outs)."""
        names = self.schema.names
        out_names = {names[i] for i in self.schema.out_args}
        fargs = [a for i, a in enumerate(margs) if i not in self.schema.out_args]
        fkwargs = {k: v for k, v in mkwargs.items() if k not in out_names}
        results = functional_meta(*fargs, **fkwargs)
        outs = [margs[i] if i < len(margs) else mkwargs[names[i]] for i in self.schema.out_args]
        return (results if isinstance(results, tuple) else (results,)), outs

    def _check_out_casts(self, margs, mkwargs, functional_meta):
        """TensorIterator's rule for out= of an elementwise op, in CPU's words: each result's dtype
        must cast safely to its out's (PyTorch's Python meta kernels word the error otherwise)."""
        results, outs = self._functional_results(margs, mkwargs, functional_meta)
        for out, result in zip(outs, results):
            if (isinstance(out, torch.Tensor) and isinstance(result, torch.Tensor)
                    and not torch.can_cast(result.dtype, out.dtype)):
                raise RuntimeError(f"result type {scalar_type_name(result.dtype)} can't be cast to the desired "
                                   f"output type {scalar_type_name(out.dtype)}")

    def _meta_of_out_overload(self, margs, mkwargs, functional_meta):
        """An out= overload whose functional has an override (or the only meta kernel): its results
        resize the out tensors as PyTorch's resize_output does."""
        results, outs = self._functional_results(margs, mkwargs, functional_meta)
        for out, result in zip(outs, results):
            if out.shape != result.shape:  # resized as the CPU kernel does: the result's layout
                out.resize_(result.shape).as_strided_(result.shape, result.stride())
        return tuple(outs) if len(outs) > 1 else outs[0]

    def _writes(self):
        schema = self.schema
        writes = []
        if schema.out_args:
            for ret, i in enumerate(schema.out_args):
                listy = schema.kinds[i] is Kind.TENSORS  # an out list (the _foreach_ ops' out=): one return, a list
                writes += [(ti, (ret, j) if listy else (ret,)) for j, ti in enumerate(self._arg_slots[i])]
        elif schema.written and schema.functional is not schema.op:
            name = schema.op._schema.name
            if name.endswith("_") and schema.written == [0]:
                slots = self._arg_slots[0]
                listy = schema.kinds[0] is Kind.TENSORS
                writes += [(ti, (0, j) if listy else (0,)) for j, ti in enumerate(slots)]
            else:  # _functional variant: fresh returns first, then the written args' new values
                n_fresh = len([a for a in schema.return_aliases if a is None])
                for k, i in enumerate(schema.written):
                    listy = schema.kinds[i] is Kind.TENSORS  # a list's new values: one return, a list
                    writes += [(ti, (n_fresh + k, j) if listy else (n_fresh + k,))
                               for j, ti in enumerate(self._arg_slots[i])]
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
                    fresh.append(((r, j), _fresh_layout(o), o.dtype))
            elif isinstance(out, torch.Tensor):
                fresh.append(((r,), _fresh_layout(out), out.dtype))
            elif out is None and self.meta_out is None:
                raise NotImplementedError(f"neuron: no meta kernel for {self.op}")
            # else: an output the op leaves undefined (a backward's masked-out gradient): None
        return fresh

    def _int_results(self) -> dict:
        outs = self.meta_out
        if not isinstance(outs, tuple):
            return {}
        return {r: int(out) for r, out in enumerate(outs)
                if isinstance(out, (int, torch.SymInt)) and not isinstance(out, bool)}

    def _compute_dtype(self, margs, mkwargs):
        return calling.compute_dtype(self.lowering, self.schema.names, margs, mkwargs)

    def apply_resizes(self, args, kwargs):
        flat = [t for t in _flat_tensors(args, kwargs) if t.device.type == "neuron"]
        for i, shape, stride in self.resize:
            t = flat[i]
            t.resize_(shape)
            if t.stride() != stride:
                t.as_strided_(shape, stride)


def template_of(schema: OpSchema, args, kwargs) -> tuple[list, dict]:
    """The lowering's arguments with the call's neuron tensors as Slot(n) (the n-th tensor) and
    its traced scalars as Slot(-k) (the k-th scalar, from 1), out= arguments left out."""
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
                return Slot(counters["t"] - 1)
            counters["s"] += 1  # a traced scalar (or a 0-dim CPU tensor taking part as one)
            return Slot(-counters["s"])
        return value

    names = schema.names
    written = set(schema.out_args)
    targs = [slot(schema.kinds[i], a) for i, a in enumerate(args)]
    tkwargs = {}
    for k, v in kwargs.items():
        s = slot(schema.kind_by_name[k], v)
        if names.index(k) not in written:
            tkwargs[k] = s
    targs = [a for i, a in enumerate(targs) if i not in written]
    return targs, tkwargs


def _meta_takes(op, margs, mkwargs) -> bool:
    """Whether `op`'s meta kernel takes this call. PyTorch registers a functional's Python meta
    kernel for every overload of its packet, out= ones included, where it knows no out arguments
    (embedding_dense_backward.out) or other names for them (grid_sampler_3d_backward.out)."""
    kernel = meta_table.get(op)
    if kernel is None:
        return True
    try:
        inspect.signature(kernel).bind(*margs, **mkwargs)
    except TypeError:
        return False
    return True


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
