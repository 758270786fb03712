"""A compiled graph called over storage buffers, as eager plans are: every input described in one
pass by (storage group, layout, dtype), or as a host tensor or a static value; the description's
spec (the storages donated, how outputs become tensors) worked out once and kept, so a training
step calls the same specs every time. Mutated inputs' buffers are donated and rebound."""
from __future__ import annotations

import math

import jax
import numpy as np
import torch

from ..runtime import deferred, device_asserts, devices, executables, generators, storages, transfer
from ..runtime.dtypes import to_jax, to_torch
from ..runtime.layout import Layout, contiguous_stride, read, write
from .interpret import is_array
from .recompiles import STATS

_BUFFER, _HOST, _STATIC = 0, 1, 2
_TRACED = "traced"  # an entry's storage offset that the call passes
_FRESH, _PASSED, _HOST_OUTPUT = "fresh", "passed", "host"


class DirectCalls:
    """Calls of `graph` (a backend.CompiledGraph without bucketing) over its inputs' storage buffers."""

    def __init__(self, graph):
        self.graph = graph
        self.interpreter = graph.interpreter
        self._functions: dict = {}  # spec id -> its Function (compiled per signature)
        self._spec_ids: dict = {}  # (input entries, device) -> spec id (the executable's static argument)
        self._specs: list[_CallSpec] = []

    def __call__(self, inputs):
        """One call: every input described by (storage group, layout, dtype), in one pass. What
        follows from that description (groups donated, outputs' tensors) is worked out once per
        description and kept in its spec: a training step calls the same specs every time."""
        deferred.flush("compiled graph")  # fused eager's pending values first (the graph reads buffers)
        storages.maybe_drain()
        entries, buffers, handles, host, offsets, index = _describe_inputs(inputs)
        key = (entries, index)  # outputs are made on the inputs' device
        spec_id = self._spec_ids.get(key)
        if spec_id is None:
            spec_id = self._spec_ids[key] = len(self._specs)
            self._specs.append(_CallSpec(entries, self.interpreter.mutated_placeholders, len(buffers)))
        spec = self._specs[spec_id]
        graph = self.graph
        device = torch.device("neuron", index if index >= 0 else graph.home_index())
        rng = None
        if graph.random_nodes:
            seed, offset = generators.next_seed_and_offset(device, None)
            rng = (np.uint64(seed), np.uint64(offset))
        compiles = STATS["compiles"]
        host_arrays = {name: transfer.cpu_numpy(torch.cat([t.detach().reshape(-1) for t in same]))
                       for name, same in host.items()}  # numpy: jit moves it with the call
        flat, new_buffers, host_new, failure = self._function_of_spec(spec_id, device.index)(
            [buffers[g] for g in spec.donated_groups], [buffers[g] for g in spec.kept_groups], host_arrays,
            np.array(offsets, np.int64) if offsets else None, rng, device_asserts.word(device.index) if graph.checked else None)
        if STATS["compiles"] != compiles:
            graph.signatures.note([(e[2], e[3]) if e[0] == _BUFFER else e[1] for e in entries])
        else:
            STATS["cache_hits"] += 1
        if storages.KEEP_RECENT:
            storages.keep_recent(flat)
        if graph.checked:
            device_asserts.update(device.index, failure)
        for group, buf in zip(spec.donated_groups, new_buffers):
            if handles[group]:
                storages.bind(handles[group], buf)
        if host_new:
            self._write_host_inputs(inputs, entries, host_new)
        return self._bind_outputs(spec, flat, buffers, device)

    def _run(self, donated, kept, host, offsets, spec_id, rng, failure):
        """The graph over storage buffers: the call spec says, per input, which buffer and layout
        it reads (or which host array, or its static value); returns the outputs flat, the new
        buffers of the donated (mutated) storages, and the new values of mutated host inputs.
        `offsets` holds, in input order, the storage offsets the spec leaves to the call."""
        STATS["compiles"] += 1
        spec = self._specs[spec_id]
        entries, donated_groups, kept_groups = spec.entries, spec.donated_groups, spec.kept_groups
        buffers = dict(zip(donated_groups, donated)) | dict(zip(kept_groups, kept))
        layouts = _layouts(entries, offsets)
        inputs = []
        for index, (kind, where, layout, dtype) in enumerate(entries):
            if kind == _BUFFER:
                inputs.append(read(storages.bitcast(buffers[where], to_jax(dtype)), layouts[index]))
            elif kind == _HOST:
                start, shape = where
                inputs.append(host[str(dtype)][start:start + math.prod(shape)].reshape(shape))
            else:
                inputs.append(where)
        outputs, mutated, failure = self.interpreter.evaluate(inputs, rng, None, failure)
        new = {}
        host_new: dict = {}  # host dtype -> flat new values of its mutated inputs, in input order
        for index, value in zip(self.interpreter.mutated_inputs, mutated):
            kind, group, _, dtype = entries[index]
            if kind == _HOST:
                host_new.setdefault(str(dtype), []).append(value.reshape(-1))
                continue
            buf = storages.bitcast(new.get(group, buffers[group]), to_jax(dtype))
            new[group] = write(buf, layouts[index], value)
        host_new = {dt: jax.numpy.concatenate(values) for dt, values in host_new.items()}
        described, flat = [], []
        for o in outputs:
            if is_array(o):
                described.append((tuple(o.shape), o.dtype))
                flat.append(o.reshape(-1))
            else:
                described.append(_Static(o))
        spec.outputs = described
        return flat, [new.get(g, buffers[g]) for g in donated_groups], host_new, failure

    def _function_of_spec(self, spec_id: int, index: int) -> executables.Function:
        function = self._functions.get(spec_id)
        if function is None:
            def run_direct(donated, kept, host, offsets, rng, failure):
                return self._run(donated, kept, host, offsets, spec_id, rng, failure)
            # (a spec is per device: its results go there even when no argument is a device array)
            function = self._functions[spec_id] = executables.Function(
                run_direct, "compile", self.graph.name, donate_argnums=(0,), device=devices.jax_device(index))
        return function

    def _write_host_inputs(self, inputs, entries, host_new):
        """Mutated host inputs (the optimizer's step counts): one device-to-host transfer and one
        foreach copy per dtype."""
        targets: dict = {}
        for i in self.interpreter.mutated_inputs:
            if entries[i][0] == _HOST:
                targets.setdefault(str(inputs[i].dtype), []).append(inputs[i])
        for name, array in host_new.items():
            same = targets[name]
            values = transfer.host_tensor(np.array(array), same[0].dtype)  # one transfer, writable
            if all(t.dim() == 0 for t in same):  # step counts: one unbind, not a view per target
                sources = values.unbind()
            else:
                sources = [v.view(t.shape) for v, t in zip(values.split([t.numel() for t in same]), same)]
            torch._foreach_copy_(same, sources)

    def _bind_outputs(self, spec, flat, input_buffers, device):
        if spec.binds is None:
            spec.prepare_binds(self.graph.host_outputs, device, flat, input_buffers)
        results, flat = [], iter(flat)
        for bind in spec.binds:
            if isinstance(bind, _Static):
                results.append(bind.value)
                continue
            shape, stride, prototype, kind = bind
            buf = next(flat)
            if kind is _PASSED:  # an input passed through: its storage keeps the buffer
                buf = jax.numpy.array(buf, copy=True)
            elif kind is _HOST_OUTPUT:
                results.append(transfer.host_tensor(np.asarray(buf).reshape(shape), prototype.dtype))
                continue
            results.append(storages.new_tensor(prototype, shape, stride, buf))
        return results


def _describe_inputs(inputs):
    """The call's inputs in one pass: per input its entry (kind, storage group or host slice or static
    value, layout, dtype), the groups' buffers and handles, the host tensors by dtype name, the
    nonzero storage offsets in input order, and the neuron device index (-1: none)."""
    entries, buffers, handles = [], [], []
    host: dict = {}  # dtype name -> host input tensors: one transfer per dtype, not per input
    host_sizes: dict = {}  # dtype name -> elements so far
    group_of: dict[int, int] = {}
    offsets = []  # the nonzero storage offsets, in input order
    lookup = storages.lookup
    index = -1
    for x in inputs:
        if not isinstance(x, torch.Tensor):
            entries.append((_STATIC, x, None, None))
            continue
        at = x.get_device()
        if at < 0:
            name = str(x.dtype)
            start = host_sizes.get(name, 0)
            host_sizes[name] = start + x.numel()
            entries.append((_HOST, (start, tuple(x.shape)), None, x.dtype))
            host.setdefault(name, []).append(x)
            continue
        index = at
        handle = x.untyped_storage().data_ptr()
        group = group_of.get(handle) if handle else None
        if group is None:
            group = len(buffers)
            buf = lookup(handle) if handle else None
            buffers.append(buf if buf is not None else storages.buffer_of(x))
            handles.append(handle)
            if handle:
                group_of[handle] = group
        # the layout as (sizes, strides, offset): Layouts are made once, while tracing. A nonzero
        # offset is an argument of the executable, not part of it: a sampling loop's
        # `timesteps[i]` is the same view at a new offset each step, and must not recompile
        offset = x.storage_offset()
        if offset:
            offsets.append(offset)
        entries.append((_BUFFER, group, (x.shape, x.stride(), _TRACED if offset else 0), x.dtype))
    return tuple(entries), buffers, handles, host, offsets, index


class _CallSpec:
    """What one description of a call's inputs decides: the storage groups donated (mutated) and
    kept, and, after the first call, how each output becomes a tensor."""

    __slots__ = ("binds", "donated_groups", "entries", "kept_groups", "outputs")

    def __init__(self, entries, mutated_placeholders, n_groups):
        self.entries = entries
        donated = {entries[i][1] for i in mutated_placeholders if entries[i][0] == _BUFFER}
        self.donated_groups = tuple(sorted(donated))
        self.kept_groups = tuple(g for g in range(n_groups) if g not in donated)
        self.outputs = None  # per output: (shape, dtype) or _Static, set while tracing
        self.binds = None

    def prepare_binds(self, host_outputs, device, flat, input_buffers):
        """Per output: a static value, or (shape, contiguous strides, an empty prototype tensor
        of its dtype and device, kind). Whether an output is an input passed through is a
        property of the traced graph, the same for every call of the spec."""
        inputs = {id(b) for b in input_buffers}
        flat = iter(flat)
        binds = []
        for i, described in enumerate(self.outputs):
            if isinstance(described, _Static):
                binds.append(described)
                continue
            shape, dtype = described
            buf = next(flat)
            prototype = torch.empty(0, dtype=to_torch(dtype), device="cpu" if i in host_outputs else device)
            if i in host_outputs:
                kind = _HOST_OUTPUT
            elif id(buf) in inputs:
                kind = _PASSED
            else:
                kind = _FRESH
            binds.append((shape, contiguous_stride(shape), prototype, kind))
        self.binds = binds


def _layouts(entries, offsets) -> dict:
    """Each buffer entry's (sizes, strides, offset) as a Layout, by input index (made while
    tracing, not per call); a _TRACED offset is the next of the call's `offsets`."""
    layouts, traced = {}, 0
    for index, (kind, _, described, _) in enumerate(entries):
        if kind != _BUFFER:
            continue
        sizes, strides, offset = described
        if offset is _TRACED:
            offset, traced = offsets[traced], traced + 1
        layouts[index] = Layout(tuple(sizes), tuple(strides), offset)
    return layouts


class _Static(tuple):
    """A graph output that is not an array (a size): the same for every call of a spec."""

    def __new__(cls, value):
        return super().__new__(cls, (value,))

    @property
    def value(self):
        return self[0]
