"""Graphs with collectives as one XLA program per rank (opt-in: TORCHNEURON_XLA_COLLECTIVES=1).

Under JAX's multi-process runtime (`runtime.devices.MULTI_PROCESS`) the ranks' devices form one mesh
axis, and a graph whose collectives all run on the world group is traced once as a `shard_map` over
it: each rank's tensors are its block of a global array, and the collectives become `lax.psum`,
`all_gather`, `psum_scatter` and `all_to_all` over the axis, which XLA runs inside the executable
(on cpu through gloo). No host staging, no segments. Graphs it cannot take (sub-groups, random ops,
dynamic shapes) run segmented (`segments.py`).

What the default path has and this one lacks: the ranks' agreement check before each collective (a
mismatch inside an XLA program is the transport's error, or a hang on some platforms), and overlap
beyond what XLA's scheduler does.
"""
from __future__ import annotations

import operator
import os

import jax
import numpy as np
import torch
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .. import config
from ..lowering import Facet
from ..lowering.collectives import AXIS
from ..runtime import deferred, device_asserts, devices, transfer
from ..runtime.dtypes import to_jax
from . import collectives

_ARRAY = object()  # an output that is an array (others are static values: sizes, None, meshes)
_F = torch.ops._c10d_functional
SPMD = Facet("spmd")  # functional collective -> its value inside the shard_map body (lowering/collectives.py)




def _mesh() -> Mesh | None:
    """One device per rank, in rank order: each rank's current NeuronCore (its LOCAL_RANK)."""
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    everyone = jax.devices(config.PLATFORM)
    chosen = []
    for rank in range(world):  # each rank is one JAX process; its core is neuron:LOCAL_RANK
        own = [d for d in everyone if d.process_index == rank]
        chosen.append(own[rank % per_host] if len(own) > rank % per_host else None)
    return None if None in chosen else Mesh(np.array(chosen), (AXIS,))


def eligible(gm: torch.fx.GraphModule) -> bool:
    """Whether `gm` can run as one program: the runtime is multi-process, every collective is on the
    world group and has a lowering here, and the graph draws no random numbers."""
    if not devices.MULTI_PROCESS or not torch.distributed.is_initialized():
        return False
    world = torch.distributed.get_world_size()
    for node in gm.graph.nodes:
        if collectives.is_start(node):
            group = collectives.group_of(node.args[-1])
            if node.target not in SPMD or group.size() != world:
                return False
    return True


def compile_graph(gm: torch.fx.GraphModule, name: str, graph_class):
    """A callable running `gm` as one SPMD program, or None where it cannot (then: segments).
    `graph_class` is backend.CompiledGraph (compile's backend module imports this one)."""
    mesh = _mesh()
    if mesh is None:
        return None

    class _Interpreter(graph_class.interpreter_class):
        def call(self, node, env, mutations, base_key, rng, random_index, sizes):
            if node.target in SPMD:
                return SPMD[node.target](*torch.fx.map_arg(node.args, env.__getitem__))
            if node.target is _F.wait_tensor.default:
                return env[node.args[0]]
            return super().call(node, env, mutations, base_key, rng, random_index, sizes)

    class _Graph(graph_class):
        interpreter_class = _Interpreter

    graph = _Graph(gm, name)
    if graph.random_nodes or graph.bucketing is not None:
        return None
    return SpmdGraph(graph, mesh)


class SpmdGraph:
    """Runs a CompiledGraph's evaluation inside `shard_map` over the ranks' mesh: each input is this
    rank's block (a leading axis of 1 added), each output this rank's block of the result."""

    def __init__(self, graph, mesh: Mesh):
        self.graph, self.mesh = graph, mesh
        self.programs: dict = {}

    def _program(self, statics: tuple, arrays_at: tuple):
        key = (statics, arrays_at)
        program = self.programs.get(key)
        if program is not None:
            return program
        graph = self.graph
        shapes: dict = {}

        def body(*blocks):
            inputs, blocks = list(statics), list(blocks)
            failure = blocks.pop()[0] if graph.checked else None  # the core's device-side failure word
            for i in arrays_at:
                inputs[i] = blocks.pop(0)[0]
            outputs, mutated, failure = graph.interpreter.evaluate(inputs, None, None, failure)
            arrays = [o for o in outputs if isinstance(o, jax.Array)]
            shapes["outputs"] = [_ARRAY if isinstance(o, jax.Array) else o for o in outputs]
            return [a[None] for a in arrays + list(mutated) + ([failure] if graph.checked else [])]

        spec = PartitionSpec(AXIS)
        shard_map = getattr(jax, "shard_map", None)
        if shard_map is None:  # (older JAX releases)
            from jax.experimental.shard_map import shard_map
        program = jax.jit(shard_map(body, mesh=self.mesh, in_specs=spec, out_specs=spec))
        self.programs[key] = program = (program, shapes)
        return program

    def _block(self, value: jax.Array, local, world: int) -> jax.Array:
        """This rank's `value` as its block of a global array over the ranks."""
        value = jax.device_put(value[None], local)
        return jax.make_array_from_single_device_arrays(
            (world, *value.shape[1:]), NamedSharding(self.mesh, PartitionSpec(AXIS)), [value])

    def __call__(self, *inputs):
        deferred.flush("compiled graph")
        device = next((x.device for x in inputs if isinstance(x, torch.Tensor) and x.device.type == "neuron"),
                      torch.device("neuron", torch.neuron.current_device()))
        local = self.mesh.devices[torch.distributed.get_rank()]
        statics, arrays_at, blocks = [], [], []
        world = self.mesh.devices.size
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                value = transfer.value_of(x) if x.device.type == "neuron" else \
                    jax.numpy.asarray(transfer.cpu_numpy(x), dtype=to_jax(x.dtype))
                blocks.append(self._block(value, local, world))
                arrays_at.append(i)
                statics.append(None)
            else:
                statics.append(x)
        if self.graph.checked:
            blocks.append(self._block(device_asserts.word(device.index), local, world))
        program, shapes = self._program(tuple(_hashable(s) for s in statics), tuple(arrays_at))
        results = [r.addressable_shards[0].data[0] for r in program(*blocks)]
        if self.graph.checked:
            device_asserts.update(device.index, results.pop())
        outputs = []
        arrays = iter(results)
        for static in shapes["outputs"]:
            outputs.append(transfer.new_from_value(next(arrays), device) if static is _ARRAY else static)
        for index, new in zip(self.graph.interpreter.mutated_inputs, arrays):
            target = inputs[index]
            if target.device.type != "neuron":
                target.copy_(torch.from_numpy(np.asarray(new)))
            else:
                transfer.assign(target, new)
        return outputs


def _hashable(x):
    return operator.index(x) if isinstance(x, torch.SymInt) else x
