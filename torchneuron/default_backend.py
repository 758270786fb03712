"""`torch.compile(model)` on neuron tensors: graphs of neuron tensors compile through the "neuron"
backend, inductor keeps every other graph.

torch.compile turns its default backend ("inductor", also when named) into
`torch._TorchCompileInductorWrapper(mode, options, dynamic)` and Dynamo calls that wrapper with each
graph. The name is looked up when torch.compile runs, so `install()` puts a subclass in its place:
a graph with a neuron tensor (an input, a parameter, a constant or an intermediate) goes to our
backend, any other graph to inductor unchanged. A subclass keeps inductor's own handling of the
wrapper (its config, cudagraph reset, equality for Dynamo's caches, `isinstance` checks in AOT
compile). docs/COMPILE.md weighs this against the alternatives.

`mode=` on neuron graphs: "default", "reduce-overhead", "max-autotune" and
"max-autotune-no-cudagraphs" all compile each graph into one XLA executable (docs/COMPILE.md);
inductor's `options=` apply to inductor's graphs only.
"""
from __future__ import annotations

import torch


def _on_neuron(graph_module: torch.fx.GraphModule, example_inputs) -> bool:
    """Whether any tensor of the graph (an example input or a node's fake value) lives on neuron."""
    for value in example_inputs:
        if isinstance(value, torch.Tensor) and value.device.type == "neuron":
            return True
    for node in graph_module.graph.nodes:
        for key in ("example_value", "val"):
            value = node.meta.get(key)
            if isinstance(value, torch.Tensor) and value.device.type == "neuron":
                return True
    return False


def install() -> None:
    """Replace torch.compile's inductor wrapper (torch 2.13: `torch._TorchCompileInductorWrapper`) by
    a subclass that routes neuron graphs to the neuron backend, once."""
    inductor_wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if inductor_wrapper is None or getattr(inductor_wrapper, "routes_neuron", False):
        return

    class NeuronRoutingInductorWrapper(inductor_wrapper):
        """torch.compile's default backend: neuron graphs to the neuron backend, others to inductor."""

        routes_neuron = True

        def __init__(self, mode, options, dynamic, *args, **kwargs):
            super().__init__(mode, options, dynamic, *args, **kwargs)
            # Dynamo reads the optimizer rules while tracing, before any graph reaches __call__
            from . import compile as _compile  # noqa: F401

        def __call__(self, model_, inputs_, **kwargs):
            if _on_neuron(model_, inputs_):
                from .compile import neuron_backend

                return neuron_backend(model_, inputs_)
            return super().__call__(model_, inputs_, **kwargs)

    torch._TorchCompileInductorWrapper = NeuronRoutingInductorWrapper
