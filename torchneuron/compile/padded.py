"""A compiled graph called at its dynamic sizes' buckets (compile/buckets.py): its inputs padded to
the bucket by one executable per true sizes, the graph compiled once per bucket with the true sizes
a traced input that masks, its outputs cut back to their true sizes by another."""
from __future__ import annotations

import numpy as np
import torch

from ..runtime import deferred, device_asserts, executables, generators, storages, transfer
from ..runtime.dtypes import to_jax, to_torch
from . import buckets
from .interpret import is_array, to_array
from .recompiles import STATS


class PaddedCalls:
    """Calls of `graph` (a backend.CompiledGraph with a bucketing plan) at its sizes' buckets."""

    def __init__(self, graph):
        self.graph = graph
        self.interpreter = graph.interpreter
        self.bucketing = graph.bucketing
        output = next(n for n in graph.gm.graph.nodes if n.op == "output")
        self.output_shapes = [buckets.shape_of(a) for a in output.args[0]]
        self.input_shapes = [buckets.shape_of(n) for n in self.interpreter.placeholders]
        # Non-tensor inputs (SymInt sizes under dynamic shapes) are static: they shape the graph (as
        # bucket sizes; the true sizes are a traced input that masks). One Function per static value,
        # compiled per signature, the executables in the runtime's bounded cache.
        self._functions: dict = {}
        self._adapted_shapes: dict = {}  # adapter key -> {index: shape of its flattened result}
        self.array_mask: tuple = ()

    def __call__(self, inputs):
        graph = self.graph
        device = self._device(inputs)
        arrays, true, sizes = self._padded_inputs(inputs, device)
        rng = None
        if graph.random_nodes:
            seed, offset = generators.next_seed_and_offset(device, None)
            rng = (np.uint64(seed), np.uint64(offset))
        self.array_mask = tuple(is_array(a) for a in arrays)
        statics = tuple(a for a in arrays if not is_array(a))
        true_sizes = np.array(list(true.values()), np.int64)
        compiles = STATS["compiles"]
        failure = device_asserts.word(device.index) if graph.checked else None
        outputs, mutated, failure = self._function_of_statics(statics)(
            [a for a in arrays if is_array(a)], rng, true_sizes, failure)
        if graph.checked:
            device_asserts.update(device.index, failure)
        if STATS["compiles"] != compiles:
            graph.signatures.note(arrays)
        else:
            STATS["cache_hits"] += 1
        for index, new in zip(self.interpreter.mutated_inputs, mutated):
            target = inputs[index]
            if target.device.type != "neuron":  # a host input, e.g. the optimizer's step counts
                target.copy_(_from_array(new, target.device, True))
            else:
                transfer.assign(target, new)
        outputs = self._adapt("unpad", list(outputs), self.output_shapes, true,
                              lambda o, shape, i: self.bucketing.unpad(o, shape, true, sizes), flatten=True)
        for index, expr in self.bucketing.size_outputs.items():
            outputs[index] = int(expr.subs(true))
        return [_from_array(o, device, i in graph.host_outputs) for i, o in enumerate(outputs)]

    def _padded_inputs(self, inputs, device):
        """The inputs padded to their buckets, the symbols' true sizes and their buckets."""
        # a contiguous input's buffer as it is (shaped inside the pad executable: shaping it out
        # here would be one small compile per input per new length)
        arrays = [_flat_or_array(x) for x in inputs]
        true, sizes = self.bucketing.sizes(inputs)
        true_shapes = [tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in inputs]
        arrays = self._adapt("pad", arrays, self.input_shapes, true,
                             lambda a, shape, i: self.bucketing.pad(a.reshape(true_shapes[i]), shape, true, sizes),
                             extra=tuple(true_shapes))
        for symbol, index in self.bucketing.symbols.items():
            arrays[index] = sizes[symbol]  # the graph's shapes are the bucket's
        for index, expr in self.bucketing.derived.items():
            arrays[index] = int(expr.subs(sizes))
        return arrays, true, sizes

    def _run_graph(self, arrays, statics, rng, true_sizes=None, failure=None):
        STATS["compiles"] += 1  # runs only while JAX traces: once per new input signature
        inputs, arrays, statics = [], list(arrays), list(statics)
        for is_an_array in self.array_mask:
            inputs.append(arrays.pop(0) if is_an_array else statics.pop(0))
        return self.interpreter.evaluate(inputs, rng, true_sizes, failure)  # (outputs, mutated, failure word)

    def _adapt(self, kind: str, values: list, shapes, true: dict, adapt, extra=(), flatten=False) -> list:
        """`values` with `adapt(array, symbolic shape, index)` applied to each array, as one
        executable per true sizes (run eagerly, JAX compiled each pad, slice and reshape on its
        own: ~40 small compiles per new length of a training step). With `flatten`, each result
        comes back flat, as a `_Flat` (its storage's buffer as it is)."""
        where = tuple(i for i, v in enumerate(values) if is_array(v))
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
            function = self._functions[key] = executables.Function(adapt_all, "compile", f"{self.graph.name}:{kind}")
        result_shapes = self._adapted_shapes[key]
        for i, value in zip(where, function([values[i] for i in where])):
            values[i] = _Flat(value, result_shapes[i]) if flatten else value
        return values

    def _function_of_statics(self, statics) -> executables.Function:
        function = self._functions.get(("graph", statics))
        if function is None:
            def run_graph(arrays, rng, true_sizes, failure):
                return self._run_graph(arrays, statics, rng, true_sizes, failure)
            function = self._functions[("graph", statics)] = executables.Function(run_graph, "compile", self.graph.name)
        return function

    def _device(self, inputs):
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.device.type == "neuron":
                return t.device
        return torch.device("neuron", self.graph.home_index())


class _Flat:
    """An output's values flat, with its shape (the unpad executable flattens them)."""

    __slots__ = ("flat", "shape")

    def __init__(self, flat, shape):
        self.flat, self.shape = flat, tuple(shape)


def _flat_or_array(x):
    """A neuron tensor that is its whole storage, contiguous, as its flat buffer; else its values."""
    if isinstance(x, torch.Tensor) and x.device.type == "neuron" and x.is_contiguous() and not x.storage_offset():
        buf = deferred.concrete(storages.lookup(x.untyped_storage().data_ptr()))
        if buf is not None and buf.dtype == to_jax(x.dtype) and buf.shape[0] == x.numel() and x.numel():
            return buf
    return to_array(x)


def _from_array(value, device, host):
    if isinstance(value, _Flat):
        if host:
            return transfer.host_tensor(np.asarray(value.flat).reshape(value.shape), to_torch(value.flat.dtype))
        return transfer.wrap(transfer.put(value.flat, device.index), value.shape, to_torch(value.flat.dtype), device)
    if not is_array(value):
        return value
    if host:
        return transfer.host_tensor(np.asarray(value), to_torch(value.dtype))
    return transfer.new_from_value(value, device)
