"""The Dynamo backend "neuron".

AOTAutograd traces forward and backward graphs of Core ATen ops (functionalized, with PyTorch's
decompositions); each graph becomes one JAX function built from the SAME lowering table the eager
driver uses, compiled once by `jax.jit` into one XLA executable. Inputs and outputs are native
neuron tensors; input mutations (BatchNorm running stats, in-place updates) are written back to the
real storages after the executable runs. A graph containing an op without a lowering runs as eager
neuron ops instead, never on CPU.
"""
from __future__ import annotations

import logging

import torch
import torch.fx
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd

from .. import config
from ..lowering import LOWERINGS
from . import buckets, collectives, higher_order, segments, xla_collectives
from .direct import DirectCalls
from .interpret import GraphInterpreter
from .padded import PaddedCalls
from .recompiles import STATS, Signatures, compile_stats  # noqa: F401 (compile_stats: imported from here too)

log = logging.getLogger("torchneuron.compile")


def _unsupported(gm: torch.fx.GraphModule) -> list[str]:
    missing = set()
    for node in gm.graph.nodes:
        if (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
                and node.target not in LOWERINGS and node.target is not torch.ops.aten.sym_size.int):
            missing.add(str(node.target))
    missing.update(higher_order.unsupported(gm))  # raises for a higher-order op we cannot run
    return sorted(missing)


class CompiledGraph:
    """One FX graph of aten ops as one jit-compiled JAX function over neuron tensors: the graph's
    values (interpret.py), called over storage buffers (direct.py) or, with dynamic sizes, at their
    buckets (padded.py); recompilations noted with their reasons (recompiles.py)."""

    interpreter_class = GraphInterpreter

    def __init__(self, gm: torch.fx.GraphModule, name: str):
        self.gm = gm
        self.name = name
        self.bucketing = buckets.plan(gm)
        self.interpreter = self.interpreter_class(gm, self.bucketing)
        self.random_nodes = self.interpreter.random_nodes
        self.checked = self.interpreter.checked
        # the NeuronCore the graph's own tensors name: a graph without neuron inputs (factories) runs there
        self.home = next((v.device.index for n in gm.graph.nodes for v in [n.meta.get("val")]
                          if isinstance(v, torch.Tensor) and v.device.type == "neuron" and v.device.index is not None),
                         None)
        output = next(n for n in gm.graph.nodes if n.op == "output")
        # Outputs the graph moved to the host (x.cpu()) leave as host tensors.
        self.host_outputs = {i for i, a in enumerate(output.args[0]) if isinstance(a, torch.fx.Node)
                             and isinstance(a.meta.get("val"), torch.Tensor) and a.meta["val"].device.type == "cpu"}
        self.signatures = Signatures(name)
        # Graphs without bucketing read and write storage buffers directly, as eager plans do: no
        # per-tensor conversion outside the executable, mutated inputs' buffers donated.
        self.calls = DirectCalls(self) if self.bucketing is None else PaddedCalls(self)
        STATS["graphs"] += 1

    def __call__(self, *inputs):
        return self.calls(inputs)

    def home_index(self) -> int:
        return self.home if self.home is not None else torch.neuron.current_device()


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
