"""The Dynamo backend "neuron".

AOTAutograd traces forward and backward graphs of Core ATen ops (functionalized, with PyTorch's
decompositions); each graph becomes one JAX function built from the SAME lowering table the eager
driver uses, compiled once by `jax.jit` into one XLA executable. Inputs and outputs are native
neuron tensors; input mutations (BatchNorm running stats, in-place updates) are written back to the
real storages after the executable runs. A graph containing an op without a lowering runs as eager
neuron ops instead, never on CPU.
"""
from __future__ import annotations

import collections
import logging
import math
import operator
import threading

import jax
import numpy as np
import torch
import torch.fx
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd

from .. import config
from ..lowering import LOWERINGS, asserts, calling, draws_random
from ..runtime import deferred, device_asserts, devices, executables, generators, storages, transfer
from ..runtime.dtypes import to_jax, to_torch
from ..runtime.layout import Layout, contiguous_stride, read, write
from . import buckets, collectives, higher_order, segments, xla_collectives

log = logging.getLogger("torchneuron.compile")
STATS = collections.Counter()
_reasons: list[str] = []
_lock = threading.Lock()

# Activation checkpointing's RNG replay (AOTAutograd's partitioner): the forward graph runs a random
# op through `run_and_save_rng_state(op, *args)` -> (state, result) and saves the state for the
# backward graph, which recomputes the op through `run_with_rng_state(state, op, *args)` and must
# draw the very same numbers. Our random ops draw from a JAX key, so the state is that key's data.
_RUN_AND_SAVE_RNG_STATE = torch.ops.higher_order.run_and_save_rng_state
_RUN_WITH_RNG_STATE = torch.ops.higher_order.run_with_rng_state


def compile_stats() -> dict:
    """Counts of graphs compiled, executable compiles, cache hits, eager-run graphs, and the reason
    for every recompilation."""
    return {**STATS, "recompile_reasons": list(_reasons)}


def _unsupported(gm: torch.fx.GraphModule) -> list[str]:
    missing = set()
    for node in gm.graph.nodes:
        if (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
                and node.target not in LOWERINGS and node.target is not torch.ops.aten.sym_size.int):
            missing.add(str(node.target))
    missing.update(higher_order.unsupported(gm))  # raises for a higher-order op we cannot run
    return sorted(missing)


class CompiledGraph:
    """One FX graph of aten ops as one jit-compiled JAX function over neuron tensors."""

    def __init__(self, gm: torch.fx.GraphModule, name: str):
        self.gm = gm
        self.name = name
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.random_nodes = [n for n in gm.graph.nodes if n.op == "call_function" and (
            n.target is _RUN_AND_SAVE_RNG_STATE
            or (n.target in LOWERINGS and draws_random(LOWERINGS[n.target], n.target, n.args, n.kwargs)))]
        # the NeuronCore the graph's own tensors name: a graph without neuron inputs (factories) runs there
        self.home = next((v.device.index for n in gm.graph.nodes for v in [n.meta.get("val")]
                          if isinstance(v, torch.Tensor) and v.device.type == "neuron" and v.device.index is not None),
                         None)
        self.mutated_inputs: list[int] = []
        # a node checks conditions on the device: the device's failure word goes through the graph
        self.checked = config.DEVICE_ASSERTS and any(
            n.op == "call_function" and n.target in LOWERINGS and LOWERINGS[n.target].checks for n in gm.graph.nodes)
        self.mutated_placeholders = sorted({
            self.placeholders.index(n.args[0]) for n in gm.graph.nodes
            if n.op == "call_function" and n.target is torch.ops.aten.copy_.default
            and n.args[0].op == "placeholder"})
        output = next(n for n in gm.graph.nodes if n.op == "output")
        # Outputs the graph moved to the host (x.cpu()) leave as host tensors.
        self.host_outputs = {i for i, a in enumerate(output.args[0]) if isinstance(a, torch.fx.Node)
                             and isinstance(a.meta.get("val"), torch.Tensor) and a.meta["val"].device.type == "cpu"}
        self.signatures: set = set()
        self.bucketing = buckets.plan(gm)
        self.output_shapes = [buckets.shape_of(a) for a in output.args[0]]
        self.input_shapes = [buckets.shape_of(n) for n in self.placeholders]
        # Non-tensor inputs (SymInt sizes under dynamic shapes) are static: they shape the graph (with
        # bucketing, as bucket sizes; the true sizes are a traced input that masks).
        # Graphs without bucketing read and write storage buffers directly, as eager plans do:
        # no per-tensor conversion outside the executable, mutated inputs' buffers donated.
        # One Function per static value (the statics, or the call spec): compiled per signature,
        # the executables in the runtime's bounded cache.
        self._functions: dict = {}
        self._adapted_shapes: dict = {}  # adapter key -> {index: shape of its flattened result}
        self._spec_ids: dict = {}  # (input entries, device) -> spec id (the executable's static argument)
        self._specs: list[_CallSpec] = []
        STATS["graphs"] += 1

    def _run_graph(self, arrays, statics, rng, true_sizes=None, failure=None):
        STATS["compiles"] += 1  # runs only while JAX traces: once per new input signature
        inputs, arrays, statics = [], list(arrays), list(statics)
        for is_array in self.array_mask:
            inputs.append(arrays.pop(0) if is_array else statics.pop(0))
        return self._evaluate(inputs, rng, true_sizes, failure)  # (outputs, mutated, failure word)

    def _run_direct(self, donated, kept, host, offsets, spec_id, rng, failure):
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
        outputs, mutated, failure = self._evaluate(inputs, rng, None, failure)
        new = {}
        host_new: dict = {}  # host dtype -> flat new values of its mutated inputs, in input order
        for index, value in zip(self.mutated_inputs, mutated):
            kind, group, _, dtype = entries[index]
            if kind == _HOST:
                host_new.setdefault(str(dtype), []).append(value.reshape(-1))
                continue
            buf = storages.bitcast(new.get(group, buffers[group]), to_jax(dtype))
            new[group] = write(buf, layouts[index], value)
        host_new = {dt: jax.numpy.concatenate(values) for dt, values in host_new.items()}
        described, flat = [], []
        for o in outputs:
            if _is_array(o):
                described.append((tuple(o.shape), o.dtype))
                flat.append(o.reshape(-1))
            else:
                described.append(_Static(o))
        spec.outputs = described
        return flat, [new.get(g, buffers[g]) for g in donated_groups], host_new, failure

    def _evaluate(self, inputs, rng, true_sizes, failure):
        env = {}
        sizes = None
        if true_sizes is not None:  # while tracing: the symbols' placeholders hold their buckets
            symbols = self.bucketing.symbols
            sizes = buckets.Sizes({s: true_sizes[k] for k, s in enumerate(symbols)},
                                  {s: inputs[i] for s, i in symbols.items()})
        for node, value in zip(self.placeholders, inputs):
            env[node] = value
        mutations = {}
        base_key = jax.random.key(rng[0]) if rng is not None else None
        random_index = {n: i for i, n in enumerate(self.random_nodes)}
        with asserts.collecting(self.checked) as checks:
            for node in self.gm.graph.nodes:
                if node.op == "call_function":
                    env[node] = self._call(node, env, mutations, base_key, rng, random_index, sizes)
                elif node.op == "get_attr":  # a captured constant tensor: baked into the executable
                    env[node] = _to_array(getattr(self.gm, node.target), None)
                elif node.op == "output":
                    outputs = [env[a] if isinstance(a, torch.fx.Node) else a for a in node.args[0]]
        ordered = sorted(mutations)
        self.mutated_inputs = ordered
        return outputs, [mutations[i] for i in ordered], (
            asserts.updated_failure(failure, checks) if self.checked else None)

    def _call(self, node, env, mutations, base_key, rng, random_index, sizes):
        def value(a):
            if isinstance(a, torch.fx.Node):
                return env[a]
            if isinstance(a, (list, tuple)):
                return type(a)(value(x) for x in a)
            return a

        args, kwargs = value(node.args), value(node.kwargs)
        target = node.target
        masking = self.bucketing.masks.get(node) if sizes is not None else None
        if masking is not None:
            args, kwargs = masking.fill(target, args, kwargs, sizes)
            if masking.counted:  # the op needs the true size: the padding rule computes it
                multi = len(target._schema.returns) > 1
                result = masking.run(target, args, kwargs, sizes)
                return _match_meta(result if multi else [result], node.meta.get("val"), multi)
        if target is operator.getitem:
            return args[0][args[1]]
        if target is _RUN_AND_SAVE_RNG_STATE:  # the op's draw, and the key it drew with
            key = jax.random.fold_in(jax.random.fold_in(base_key, rng[1]), random_index[node])
            result = self._lowered(args[0], node.args[1:], node.kwargs, list(args[1:]), kwargs, key, None)
            return jax.random.key_data(key).astype(np.int64), result
        if target is _RUN_WITH_RNG_STATE:  # the same draw again, from the saved key
            key = jax.random.wrap_key_data(args[0].astype(np.uint32))
            return self._lowered(args[1], node.args[2:], node.kwargs, list(args[2:]), kwargs, key,
                                 node.meta.get("val"))
        if target is torch.ops.aten.sym_size.int:  # a size read off an array: static while tracing
            return args[0].shape[args[1]]
        if higher_order.is_higher_order(target):  # FlexAttention: its subgraphs through the table
            return higher_order.run(node, args, kwargs)
        if not isinstance(target, torch._ops.OpOverload):
            return target(*args, **kwargs)  # size arithmetic on static ints (operator.mul)
        if target is torch.ops.aten.copy_.default and node.args[0].op == "placeholder":
            index = self.placeholders.index(node.args[0])
            new = jax.numpy.broadcast_to(args[1], args[0].shape).astype(args[0].dtype)
            mutations[index] = new
            env[node.args[0]] = new
            return new
        key = None
        if node in random_index:
            key = jax.random.fold_in(jax.random.fold_in(base_key, rng[1]), random_index[node])
        return self._lowered(target, node.args, node.kwargs, args, kwargs, key, node.meta.get("val"))

    @staticmethod
    def _lowered(target, node_args, node_kwargs, args, kwargs, key, meta):
        """`target`'s lowering on the values `args`/`kwargs` (the node's own for their metadata)."""
        lowering = LOWERINGS[target]
        meta_args = _meta_values(node_args)
        meta_kwargs = _meta_values(node_kwargs)
        compute = calling.compute_dtype(lowering, [a.name for a in target._schema.arguments], meta_args,
                                        meta_kwargs)
        if "device" in kwargs:
            kwargs = {**kwargs, "device": None}
        flags = calling.static_flags(target, lowering, meta_args, meta_kwargs, meta)
        results = calling.invoke(target, lowering, list(args), dict(kwargs), compute, key, flags)
        return _match_meta(results, meta, len(target._schema.returns) > 1)

    def __call__(self, *inputs):
        if self.bucketing is None:
            return self._call_direct(inputs)
        device = self._device(inputs)
        # a contiguous input's buffer as it is (shaped inside the pad executable: shaping it out
        # here would be one small compile per input per new length)
        arrays = [_flat_or_array(x, device) for x in inputs]
        true = None
        if self.bucketing is not None:
            true, sizes = self.bucketing.sizes(inputs)
            true_shapes = [tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in inputs]
            arrays = self._adapt("pad", arrays, self.input_shapes, true,
                                 lambda a, shape, i: self.bucketing.pad(a.reshape(true_shapes[i]), shape, true, sizes),
                                 extra=tuple(true_shapes))
            for symbol, index in self.bucketing.symbols.items():
                arrays[index] = sizes[symbol]  # the graph's shapes are the bucket's
            for index, expr in self.bucketing.derived.items():
                arrays[index] = int(expr.subs(sizes))
        rng = None
        if self.random_nodes:
            seed, offset = generators.next_seed_and_offset(device, None)
            rng = (np.uint64(seed), np.uint64(offset))
        self.array_mask = tuple(_is_array(a) for a in arrays)
        statics = tuple(a for a in arrays if not _is_array(a))
        true_sizes = None if true is None else np.array(list(true.values()), np.int64)
        compiles = STATS["compiles"]
        failure = device_asserts.word(device.index) if self.checked else None
        outputs, mutated, failure = self._function_of_statics(statics)(
            [a for a in arrays if _is_array(a)], rng, true_sizes, failure)
        if self.checked:
            device_asserts.update(device.index, failure)
        if STATS["compiles"] != compiles:
            self._note_compile(arrays)
        else:
            STATS["cache_hits"] += 1
        for index, new in zip(self.mutated_inputs, mutated):
            target = inputs[index]
            if target.device.type != "neuron":  # a host input, e.g. the optimizer's step counts
                target.copy_(_from_array(new, target.device, True))
            else:
                transfer.assign(target, new)
        if true is not None:
            outputs = self._adapt("unpad", list(outputs), self.output_shapes, true,
                                  lambda o, shape, i: self.bucketing.unpad(o, shape, true, sizes), flatten=True)
            for index, expr in self.bucketing.size_outputs.items():
                outputs[index] = int(expr.subs(true))
        return [_from_array(o, device, i in self.host_outputs) for i, o in enumerate(outputs)]

    def _call_direct(self, inputs):
        """One call: every input described by (storage group, layout, dtype), in one pass. What
        follows from that description (groups donated, outputs' tensors) is worked out once per
        description and kept in its spec: a training step calls the same specs every time."""
        deferred.flush("compiled graph")  # fused eager's pending values first (the graph reads buffers)
        storages.maybe_drain()
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
        entries = tuple(entries)
        key = (entries, index)  # outputs are made on the inputs' device
        spec_id = self._spec_ids.get(key)
        if spec_id is None:
            spec_id = self._spec_ids[key] = len(self._specs)
            self._specs.append(_CallSpec(entries, self.mutated_placeholders, len(buffers)))
        spec = self._specs[spec_id]
        device = torch.device("neuron", index if index >= 0 else self._home_index())
        rng = None
        if self.random_nodes:
            seed, offset = generators.next_seed_and_offset(device, None)
            rng = (np.uint64(seed), np.uint64(offset))
        compiles = STATS["compiles"]
        host_arrays = {name: transfer.cpu_numpy(torch.cat([t.detach().reshape(-1) for t in same]))
                       for name, same in host.items()}  # numpy: jit moves it with the call
        flat, new_buffers, host_new, failure = self._function_of_spec(spec_id, device.index)(
            [buffers[g] for g in spec.donated_groups], [buffers[g] for g in spec.kept_groups], host_arrays,
            np.array(offsets, np.int64) if offsets else None, rng, device_asserts.word(device.index) if self.checked else None)
        if STATS["compiles"] != compiles:
            self._note_compile([(e[2], e[3]) if e[0] == _BUFFER else e[1] for e in entries])
        else:
            STATS["cache_hits"] += 1
        if storages.KEEP_RECENT:
            storages.keep_recent(flat)
        if self.checked:
            device_asserts.update(device.index, failure)
        for group, buf in zip(spec.donated_groups, new_buffers):
            if handles[group]:
                storages.bind(handles[group], buf)
        if host_new:
            self._write_host_inputs(inputs, entries, host_new)
        return self._bind_outputs(spec, flat, buffers, device)

    def _write_host_inputs(self, inputs, entries, host_new):
        """Mutated host inputs (the optimizer's step counts): one device-to-host transfer and one
        foreach copy per dtype."""
        targets: dict = {}
        for i in self.mutated_inputs:
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
            spec.prepare_binds(self.host_outputs, device, flat, input_buffers)
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

    def _adapt(self, kind: str, values: list, shapes, true: dict, adapt, extra=(), flatten=False) -> list:
        """`values` with `adapt(array, symbolic shape, index)` applied to each array, as one
        executable per true sizes (run eagerly, JAX compiled each pad, slice and reshape on its
        own: ~40 small compiles per new length of a training step). With `flatten`, each result
        comes back flat, as a `_Flat` (its storage's buffer as it is)."""
        where = tuple(i for i, v in enumerate(values) if _is_array(v))
        key = (kind, where, tuple(true.items()), extra)
        function = self._functions.get(key)
        if function is None:
            result_shapes = self._adapted_shapes[key] = {}  # filled while tracing

            def adapt_all(arrays):
                results = [adapt(a, shapes[i], i) for i, a in zip(where, arrays)]
                if not flatten:
                    return results
                result_shapes.update({i: r.shape for i, r in zip(where, results)})
                return [r.reshape(-1) for r in results]
            function = self._functions[key] = executables.Function(adapt_all, "compile", f"{self.name}:{kind}")
        result_shapes = self._adapted_shapes[key]
        for i, value in zip(where, function([values[i] for i in where])):
            values[i] = _Flat(value, result_shapes[i]) if flatten else value
        return values

    def _function_of_statics(self, statics) -> executables.Function:
        function = self._functions.get(("graph", statics))
        if function is None:
            def run_graph(arrays, rng, true_sizes, failure):
                return self._run_graph(arrays, statics, rng, true_sizes, failure)
            function = self._functions[("graph", statics)] = executables.Function(run_graph, "compile", self.name)
        return function

    def _function_of_spec(self, spec_id: int, index: int) -> executables.Function:
        function = self._functions.get(spec_id)
        if function is None:
            def run_direct(donated, kept, host, offsets, rng, failure):
                return self._run_direct(donated, kept, host, offsets, spec_id, rng, failure)
            # (a spec is per device: its results go there even when no argument is a device array)
            function = self._functions[spec_id] = executables.Function(
                run_direct, "compile", self.name, donate_argnums=(0,), device=devices.jax_device(index))
        return function

    def _device(self, inputs):
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.device.type == "neuron":
                return t.device
        return torch.device("neuron", self._home_index())

    def _home_index(self) -> int:
        return self.home if self.home is not None else torch.neuron.current_device()

    def _note_compile(self, arrays):
        signature = tuple((a.shape, a.dtype) if _is_array(a) else a for a in arrays)
        if self.signatures:
            reason = f"{self.name}: new input signature {_describe_change(self.signatures, signature)}"
            _reasons.append(reason)
            if "recompiles" in config.LOG:
                print(f"torchneuron recompile: {reason}")
        self.signatures.add(signature)


_BUFFER, _HOST, _STATIC = 0, 1, 2
_TRACED = "traced"  # an entry's storage offset that the call passes
_FRESH, _PASSED, _HOST_OUTPUT = "fresh", "passed", "host"


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


def _is_array(x) -> bool:
    """An array (traced or concrete), not a static input such as a size or a DeviceMesh (which has a
    `shape` too: DTensor graphs pass meshes through)."""
    return isinstance(x, (jax.Array, np.ndarray))


class _Static(tuple):
    """A graph output that is not an array (a size): the same for every call of a spec."""

    def __new__(cls, value):
        return super().__new__(cls, (value,))

    @property
    def value(self):
        return self[0]


def _to_array(x, device):
    if isinstance(x, torch.Tensor):
        if x.device.type != "neuron":
            return jax.numpy.asarray(transfer.cpu_numpy(x))
        return transfer.value_of(x)
    return x


class _Flat:
    """An output's values flat, with its shape (the unpad executable flattens them)."""

    __slots__ = ("flat", "shape")

    def __init__(self, flat, shape):
        self.flat, self.shape = flat, tuple(shape)


def _flat_or_array(x, device):
    """A neuron tensor that is its whole storage, contiguous, as its flat buffer; else its values."""
    if isinstance(x, torch.Tensor) and x.device.type == "neuron" and x.is_contiguous() and not x.storage_offset():
        buf = deferred.concrete(storages.lookup(x.untyped_storage().data_ptr()))
        if buf is not None and buf.dtype == to_jax(x.dtype) and buf.shape[0] == x.numel() and x.numel():
            return buf
    return _to_array(x, device)


def _from_array(value, device, host):
    if isinstance(value, _Flat):
        if host:
            return transfer.host_tensor(np.asarray(value.flat).reshape(value.shape), to_torch(value.flat.dtype))
        return transfer.wrap(transfer.put(value.flat, device.index), value.shape, to_torch(value.flat.dtype), device)
    if not _is_array(value):
        return value
    if host:
        return transfer.host_tensor(np.asarray(value), to_torch(value.dtype))
    return transfer.new_from_value(value, device)


def _meta_values(x):
    if isinstance(x, torch.fx.Node):
        return x.meta.get("val")
    if isinstance(x, (list, tuple)):
        return type(x)(_meta_values(v) for v in x)
    if isinstance(x, dict):
        return {k: _meta_values(v) for k, v in x.items()}
    return x


def _match_meta(results, meta, multi):
    """Broadcast and cast results to the shapes and dtypes the graph recorded (as the eager driver
    does with meta kernels)."""
    from ..runtime.dtypes import to_jax

    def one(r, m):
        if isinstance(m, torch.Tensor) and _is_array(r):
            r = r.astype(to_jax(m.dtype))
            if all(type(d) is int for d in m.shape):  # symbolic sizes: the value already has them
                r = jax.numpy.broadcast_to(r, tuple(m.shape))
            return r
        if isinstance(m, (list, tuple)) and isinstance(r, (list, tuple)):
            return [one(a, b) for a, b in zip(r, m)]
        return r

    if multi:
        return tuple(one(r, m) for r, m in zip(results, meta or [None] * len(results)))
    return one(results[0], meta)


def _describe_change(seen, signature) -> str:
    previous = next(iter(seen))
    changes = [f"input {i}: {a} -> {b}" for i, (a, b) in enumerate(zip(previous, signature)) if a != b]
    return "; ".join(changes[:3]) or "different number of inputs"


def compile_graph(gm: torch.fx.GraphModule, example_inputs, name: str = "graph"):
    if collectives.in_graph(gm):
        if config.XLA_COLLECTIVES and xla_collectives.eligible(gm) and not [
                op for op in _unsupported(gm) if not op.startswith("_c10d_functional.")]:
            spmd = xla_collectives.compile_graph(gm, name, CompiledGraph)
            if spmd is not None:  # one XLA program per rank, the collectives inside
                STATS["spmd_graphs"] += 1
                return spmd
        # Collectives run between compiled segments, issued early and waited for late.
        segmented = segments.SegmentedGraph(gm, name, lambda module, part: compile_graph(module, None, part))
        STATS["segmented_graphs"] += 1
        STATS["graph_collectives"] += segmented.collectives
        STATS["collective_buckets"] += segmented.buckets
        return segmented
    missing = _unsupported(gm)
    if missing:
        # Run the graph as eager neuron ops: slower, never on CPU.
        STATS["eager_graphs"] += 1
        log.warning("neuron compile: %s has ops without lowerings (%s); running it eagerly on neuron",
                    name, ", ".join(missing))
        return _eager_graph(gm, example_inputs)
    compiled = CompiledGraph(gm, name)

    def run(*inputs):
        return compiled(*inputs)

    return run


def _traced_strides(example) -> tuple | None:
    """The strides an input was traced with, where they are plain ints (None: not a tensor, or
    symbolic)."""
    if not isinstance(example, torch.Tensor):
        return None
    stride = tuple(example.stride())
    return stride if all(type(s) is int for s in (*example.shape, *stride)) else None


def _eager_graph(gm: torch.fx.GraphModule, example_inputs):
    """The graph run as eager neuron ops, each tensor input laid out with the strides it was traced
    with: a compiled forward hands its saved tensors over contiguous, and a `view` in the backward
    that is valid for the traced strides (a transposed activation) is not for those."""
    strides = [_traced_strides(x) for x in example_inputs or ()]
    if not any(s is not None for s in strides):
        return gm

    def run(*inputs):
        laid_out = []
        for x, stride in zip(inputs, strides):
            if stride is not None and isinstance(x, torch.Tensor) and tuple(x.stride()) != stride:
                target = torch.empty_strided(x.shape, stride, dtype=x.dtype, device=x.device)
                if torch._debug_has_internal_overlap(target) == 0:  # (an expanded layout cannot be written)
                    x = target.copy_(x)
            laid_out.append(x)
        return gm(*laid_out, *inputs[len(laid_out):])

    return run


# PyTorch's Core ATen decompositions, except where the table has a dedicated lowering.
_DECOMPOSITIONS = {op: fn for op, fn in core_aten_decompositions().items() if op not in LOWERINGS}


def _boxed(run):
    """AOTAutograd's calling convention: one list of inputs, which the callee empties, so that a
    backward's saved tensors are not kept alive by the list while the graph runs."""
    def boxed(args: list):
        inputs = tuple(args)
        args.clear()
        return run(*inputs)

    boxed._boxed_call = True
    return boxed


def _forward(gm, example_inputs):
    return _boxed(compile_graph(gm, example_inputs, "forward"))


def _backward(gm, example_inputs):
    return _boxed(compile_graph(gm, example_inputs, "backward"))


neuron_backend = aot_autograd(fw_compiler=_forward, bw_compiler=_backward, decompositions=_DECOMPOSITIONS,
                              keep_inference_input_mutations=True)


def register() -> None:
    from torch._dynamo import register_backend

    register_backend(name="neuron")(neuron_backend)
