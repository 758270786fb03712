"""A compiled graph's values: its FX graph of aten ops evaluated on JAX values, node by node through
the lowering table (random draws and their replay, padded ops masked at their true sizes, writes into
inputs); the backend traces this once per input signature into one executable."""
from __future__ import annotations

import operator

import jax
import numpy as np
import torch
import torch.fx

from .. import config
from ..lowering import LOWERINGS, asserts, calling, draws_random
from ..runtime import transfer
from ..runtime.dtypes import to_jax
from . import buckets, higher_order

# Activation checkpointing's RNG replay (AOTAutograd's partitioner): the forward graph runs a random
# op through `run_and_save_rng_state(op, *args)` -> (state, result) and saves the state for the
# backward graph, which recomputes the op through `run_with_rng_state(state, op, *args)` and must
# draw the very same numbers. Our random ops draw from a JAX key, so the state is that key's data.
_RUN_AND_SAVE_RNG_STATE = torch.ops.higher_order.run_and_save_rng_state
_RUN_WITH_RNG_STATE = torch.ops.higher_order.run_with_rng_state


class GraphInterpreter:
    """`gm` evaluated on JAX values: `evaluate(inputs, rng, true_sizes, failure)` gives the outputs,
    the new values of the inputs the graph writes (their indices in `mutated_inputs`, known once
    traced) and the device's failure word. `bucketing` (compile/buckets.py) masks ops at padded sizes."""

    def __init__(self, gm: torch.fx.GraphModule, bucketing):
        self.gm = gm
        self.bucketing = bucketing
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.random_nodes = [n for n in gm.graph.nodes if n.op == "call_function" and (
            n.target is _RUN_AND_SAVE_RNG_STATE
            or (n.target in LOWERINGS and draws_random(LOWERINGS[n.target], n.target, n.args, n.kwargs)))]
        self.mutated_inputs: list[int] = []
        # a node checks conditions on the device: the device's failure word goes through the graph
        self.checked = config.DEVICE_ASSERTS and any(
            n.op == "call_function" and n.target in LOWERINGS and LOWERINGS[n.target].checks for n in gm.graph.nodes)
        self.mutated_placeholders = sorted({
            self.placeholders.index(n.args[0]) for n in gm.graph.nodes
            if n.op == "call_function" and n.target is torch.ops.aten.copy_.default
            and n.args[0].op == "placeholder"})

    def evaluate(self, inputs, rng, true_sizes, failure):
        """(outputs, new values of the written inputs, failure word) of the graph on `inputs`."""
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
                    env[node] = self.call(node, env, mutations, base_key, rng, random_index, sizes)
                elif node.op == "get_attr":  # a captured constant tensor: baked into the executable
                    env[node] = to_array(getattr(self.gm, node.target))
                elif node.op == "output":
                    outputs = [env[a] if isinstance(a, torch.fx.Node) else a for a in node.args[0]]
        ordered = sorted(mutations)
        self.mutated_inputs = ordered
        return outputs, [mutations[i] for i in ordered], (
            asserts.updated_failure(failure, checks) if self.checked else None)

    def call(self, node, env, mutations, base_key, rng, random_index, sizes):
        """The value of one call_function node."""
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
        if target is _RUN_AND_SAVE_RNG_STATE or target is _RUN_WITH_RNG_STATE:
            return self._replayable_draw(node, args, kwargs, base_key, rng, random_index)
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
        return _lowered(target, node.args, node.kwargs, args, kwargs, key, node.meta.get("val"))

    @staticmethod
    def _replayable_draw(node, args, kwargs, base_key, rng, random_index):
        if node.target is _RUN_AND_SAVE_RNG_STATE:  # the op's draw, and the key it drew with
            key = jax.random.fold_in(jax.random.fold_in(base_key, rng[1]), random_index[node])
            result = _lowered(args[0], node.args[1:], node.kwargs, list(args[1:]), kwargs, key, None)
            return jax.random.key_data(key).astype(np.int64), result
        # the same draw again, from the saved key
        key = jax.random.wrap_key_data(args[0].astype(np.uint32))
        return _lowered(args[1], node.args[2:], node.kwargs, list(args[2:]), kwargs, key, node.meta.get("val"))


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


def is_array(x) -> bool:
    """An array (traced or concrete), not a static input such as a size or a DeviceMesh (which has a
    `shape` too: DTensor graphs pass meshes through)."""
    return isinstance(x, (jax.Array, np.ndarray))


def to_array(x):
    """A tensor's values as an array (a host tensor's copied), anything else as it is."""
    if isinstance(x, torch.Tensor):
        if x.device.type != "neuron":
            return jax.numpy.asarray(transfer.cpu_numpy(x))
        return transfer.value_of(x)
    return x


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

    def one(r, m):
        if isinstance(m, torch.Tensor) and is_array(r):
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
