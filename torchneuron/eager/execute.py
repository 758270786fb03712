"""Executing a plan: one jit-compiled call that reads every input from its storage's buffer,
computes with the lowering, writes the written storages' new buffers and makes the fresh
outputs' tensors.

`PlanExecution` is the executing half of `plan.Plan`; the plan's building half decides
everything this half reads (template, writes, fresh outputs, groups, layouts).
"""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from ..lowering import asserts, calling
from ..runtime import deferred, device_asserts, executables, storages, transfer
from ..runtime.dtypes import host_scalar, to_jax
from ..runtime.generators import next_seed_and_offset
from ..runtime.layout import apply_math_bits, flatten, read, write
from .describe import CallDescription, buffers_of, device_error

_KEEP_RECENT = storages.KEEP_RECENT  # (read per op: a global, not an attribute)
_fused = deferred._mode  # {"fused": bool}: record plans in the current segment instead of running them
_capture = deferred._capture  # {"recording": None or the graph capture in progress, ...}
_NOT_COMPILED_FOR = executables.NOT_COMPILED_FOR
_BIND_IN_BULK = 8  # written storages from which a call binds them in one pass (a foreach op's tens)
_bind = storages.bind


class Slot:
    """A placeholder in the argument template: the n-th tensor or scalar of the call."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index

    def __repr__(self):  # (part of a plan's persistent name: no address)
        return f"Slot({self.index})"


def fill_template(template_args, template_kwargs, values, scalars) -> tuple[list, dict]:
    """The lowering's arguments: each Slot of the template replaced by the call's tensor values
    (Slot(n)) or scalars (Slot(-k))."""
    def fill(node):
        if isinstance(node, Slot):
            return values[node.index] if node.index >= 0 else scalars[-node.index - 1]
        if isinstance(node, list):
            return [fill(n) for n in node]
        return node

    return [fill(node) for node in template_args], {k: fill(node) for k, node in template_kwargs.items()}


class PlanExecution:
    """The executing half of a plan (see plan.Plan for the attributes it reads)."""

    def _call_lowering(self, values, scalars, rng):
        call_args, call_kwargs = fill_template(self.template_args, self.template_kwargs, values,
                                               scalars if self.static_scalars is None else self.static_scalars)
        key = jax.random.fold_in(jax.random.key(rng[0]), rng[1]) if self.random else None
        return calling.invoke(self.schema.functional, self.lowering, call_args, call_kwargs,
                              self.compute_dtype, key, self.layout_flags)

    def _body(self, *flat):
        if self.checked:  # the device's failure word comes last
            flat, failure = flat[:-1], flat[-1]
        n_w, n_o = len(self.written_groups), len(self.read_groups)
        written, others = flat[:n_w], flat[n_w:n_w + n_o]
        scalars = flat[n_w + n_o:]
        rng = None
        if self.random:
            scalars, rng = scalars[:-2], scalars[-2:]
        layouts = self.layouts
        if self.traced_offsets or self.traced_strides:
            scalars, layout_args = scalars[:-1], scalars[-1]
            layouts = self._at_layout_args(layout_args)
        buffers = [None] * (len(written) + len(others))
        for g, b in zip(self.written_groups, written):
            buffers[g] = b
        for g, b in zip(self.read_groups, others):
            buffers[g] = b
        values = self._read_all(buffers, layouts)
        scalars = [jnp.asarray(s) for s in scalars]
        with asserts.collecting(self.checked) as checks:
            results = self._call_lowering(values, scalars, rng)
        new = {}
        for ti, path in self.writes:
            g = self.groups[ti]
            buf = new.get(g, buffers[g])
            buf = storages.bitcast(buf, to_jax(self.dtypes[ti]))
            # storing x through a conj (neg) view stores conj(x) (-x): the bits are self-inverse
            new[g] = write(buf, layouts[ti], apply_math_bits(_at(results, path), self.bits[ti]))
        # An empty result takes no values: its meta layout may be empty where the lowering's is
        # not (eval batch norm's saved statistics).
        for path, lay, _ in self.fresh:
            if lay.numel and _at(results, path) is None:
                raise RuntimeError(f"neuron: the lowering of {self.op} gave no value for its result {path}, "
                                   f"which PyTorch's meta kernel makes (shape {tuple(lay.shape)})")
        fresh = [jnp.zeros((0,), to_jax(dt)) if lay.numel == 0 else
                 flatten(jnp.broadcast_to(_at(results, path), lay.shape).astype(to_jax(dt)), lay)
                 for path, lay, dt in self.fresh]
        outputs = (*[new[g] for g in self.written_groups], *fresh)  # flat: the fastest jit outputs
        return (*outputs, asserts.updated_failure(failure, checks)) if self.checked else outputs

    def __call__(self, args, kwargs, desc: CallDescription):
        # (a call outside jit reads its buffers' values: fused eager's zeros would wait for a flush)
        buffers = buffers_of(desc, run=self.function is not None) if desc.missing else desc.buffers
        rng = _next_rng(self.device, args, kwargs, self.schema) if self.random else None
        if self.function is None:
            return self._call_outside_jit(args, kwargs, desc, buffers, rng)
        flat = list(buffers) if self.in_order else [buffers[g] for g in self.arg_groups]
        if desc.scalars:
            flat += [host_scalar(v) for v in desc.scalars]
        if self.traced_offsets or self.traced_strides:
            flat.append(self._layout_args_of(desc))
        rng_at = -1
        if rng is not None:
            rng_at = len(flat)
            flat += [np.uint64(rng[0]), np.uint64(rng[1])]
        if self.checked:
            flat.append(device_asserts.word(self.device_index))
        function = self.function
        if _fused["fused"]:
            outputs = deferred.record(function, flat, self.device_index, rng_at)
        else:
            function.calls += 1
            try:
                outputs = function.compiled(*flat)
            except _NOT_COMPILED_FOR:  # a signature not compiled yet (or evicted): raised before running
                outputs = function.call_new(flat)
            if _KEEP_RECENT:
                storages.keep_recent(outputs)
        if self.checked:
            device_asserts.update(self.device_index, outputs[-1])
        n_written = self.n_written
        if n_written:
            handles = desc.handles
            written = list(map(handles.__getitem__, self.written_tensor)) if n_written >= _BIND_IN_BULK else ()
            if written and 0 not in written:
                storages.bind_each(written, outputs[:n_written])
            else:
                for ti, buf in zip(self.written_tensor, outputs[:n_written]):
                    if handles[ti]:
                        _bind(handles[ti], buf)
            if _capture["recording"] is not None:
                for ti in self.written_tensor:
                    if handles[ti]:
                        deferred.keep(desc.tensors[ti].untyped_storage())
        if self.single_fresh:
            return self._single_result(outputs[n_written])
        return self._results(args, kwargs, outputs[n_written:])

    def _execute_simple(self, args, kwargs, desc: CallDescription):
        flat = buffers_of(desc, run=True) if desc.missing else desc.buffers
        if desc.scalars:
            flat = [*flat, *[host_scalar(v) for v in desc.scalars]]
        return self.run_buffers(flat)

    def run_buffers(self, flat):
        """A simple plan's call on its argument buffers: one fresh result."""
        if self.checked:
            flat = [*flat, device_asserts.word(self.device_index)]
        function = self.function
        if _fused["fused"]:
            outputs = deferred.record(function, flat, self.device_index)
        else:
            function.calls += 1
            try:
                outputs = function.compiled(*flat)
            except _NOT_COMPILED_FOR:
                outputs = function.call_new(flat)
            if _KEEP_RECENT:
                storages.keep_recent(outputs)
        if self.checked:
            device_asserts.update(self.device_index, outputs[-1])
        return self._single_result(outputs[0])

    def _single_result(self, buf):
        shape, stride, prototype, nonempty = self.single_fresh
        t = prototype.new_empty_strided(shape, stride)  # dtype and device from an empty prototype
        if nonempty:  # a fresh tensor starts at offset 0: its data pointer is its storage's
            _bind(t.data_ptr(), buf)
            if _capture["recording"] is not None:
                deferred.keep(t.untyped_storage())
        return t

    def _results(self, args, kwargs, fresh_buffers):
        tensors = [storages.new_tensor(prototype, lay.shape, lay.stride, buf)
                   for (_, lay, _), prototype, buf in zip(self.fresh, self.fresh_prototypes, fresh_buffers)]
        if _capture["recording"] is not None:
            for t in tensors:
                deferred.keep(t.untyped_storage())
        if self.fresh_in_order:
            return tuple(tensors)
        return self._assemble(args, kwargs, [(path, t) for (path, _, _), t in zip(self.fresh, tensors)])

    def _assemble(self, args, kwargs, made):
        schema = self.schema
        n_returns = len(schema.return_aliases)
        if not n_returns:
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
                out.append(by_return.get(fresh_index, self.int_results.get(r, [] if schema.list_returns[r] else None)))
                fresh_index += 1
        return out[0] if n_returns == 1 else tuple(out)

    def _read_all(self, buffers, layouts):
        """Every tensor argument's values: its layout read from its buffer, math bits applied."""
        return [apply_math_bits(read(storages.bitcast(buffers[g], to_jax(dt)), lay), bits)
                for g, dt, lay, bits in zip(self.groups, self.dtypes, layouts, self.bits)]

    def _layout_args_of(self, desc: CallDescription):
        """This call's offsets and strides that the program takes as arguments (traced_offsets,
        then each of traced_strides' strides)."""
        tensors = desc.tensors
        values = [tensors[i].storage_offset() for i in self.traced_offsets]
        for i in self.traced_strides:
            values.extend(tensors[i].stride())
        return np.asarray(values, np.int64)

    def _at_layout_args(self, values) -> list:
        """The layouts with the traced offsets and strides in place (traced, or host ints)."""
        layouts = list(self.layouts)
        for k, i in enumerate(self.traced_offsets):
            layouts[i] = layouts[i]._replace(offset=values[k])
        at = len(self.traced_offsets)
        for i in self.traced_strides:
            n = len(layouts[i].shape)
            layouts[i] = layouts[i]._replace(stride=tuple(values[at + d] for d in range(n)))
            at += n
        return layouts

    def _call_outside_jit(self, args, kwargs, desc, buffers, rng):
        buffers = deferred.concrete_all(buffers, f"data-dependent {self.op}")
        layouts = self.layouts  # (a plan with traced layouts serves other offsets and strides: this call's)
        if self.traced_offsets or self.traced_strides:
            layouts = self._at_layout_args(self._layout_args_of(desc).tolist())
        values = self._read_all(buffers, layouts)
        results = self._call_lowering(values, [jnp.asarray(s) for s in desc.scalars], rng)
        made = []
        for r, res in enumerate(results):
            made.append(((r,), transfer.new_from_value(jnp.asarray(res), self.device)))
        if self.schema.out_args:  # out= of a data-dependent op: resize the outs, then copy in
            names = self.schema.names
            outs = [args[i] if i < len(args) else kwargs[names[i]] for i in self.schema.out_args]
            return fill_outs(outs, [t for _, t in made], self.schema.op)
        return self._assemble(args, kwargs, made)


def fill_outs(outs, results, op):
    """out= after the fact: each out resized to its result's shape as PyTorch's resize_output does
    (with its warning where the out held elements), then filled by a copy; returns the outs as the
    op returns them. An out on another device is refused, as the meta kernels refuse it elsewhere."""
    for out, result in zip(outs, results):
        if out.device != result.device:
            raise device_error(op, result.device, out.device)
        if out.shape != result.shape:
            if out.numel():
                warnings.warn(f"An output with one or more elements was resized since it had shape {list(out.shape)}, "
                              f"which does not match the required output shape {list(result.shape)} (neuron: "
                              f"{op}). Resize an out tensor to zero elements to reuse it without this warning.",
                              UserWarning, stacklevel=2)
            out.resize_(result.shape)
        out.copy_(result)
    return tuple(outs) if len(outs) > 1 else outs[0]


def _at(results, path):
    v = results[path[0]]
    return v[path[1]] if len(path) == 2 else v


def _next_rng(device, args, kwargs, schema):
    gen = kwargs.get("generator")
    if gen is None and "generator" in schema.names:
        i = schema.names.index("generator")
        gen = args[i] if i < len(args) else None
    return next_seed_and_offset(device, gen)

