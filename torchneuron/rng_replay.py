"""PyTorch's RNG-replay operators on neuron tensors, outside our compiled graphs.

Activation checkpointing under `torch.compile` wraps each random op of a recomputed region in
`run_and_save_rng_state` (forward: the generator's state, then the op) and `run_with_rng_state`
(backward: the op again from that state). PyTorch implements them for CPU, CUDA, HPU and XPU only;
these kernels give neuron the same meaning with `torch.neuron`'s generator state, for graphs run
op by op (the `aot_eager` backend, a graph our backend hands to eager). Inside the "neuron"
backend's own executables the state is the JAX key the op drew with (compile/backend.py).
"""
from __future__ import annotations

import torch
from torch._C import DispatchKey

_installed = False


def _run_and_save_rng_state(op, *args, **kwargs):
    return torch.neuron.get_rng_state(), op(*args, **kwargs)


def _run_with_rng_state(rng_state, op, *args, **kwargs):
    current = torch.neuron.get_rng_state()
    torch.neuron.set_rng_state(rng_state.cpu())
    try:
        return op(*args, **kwargs)
    finally:
        torch.neuron.set_rng_state(current)


def _on_neuron(args) -> bool:
    return any(isinstance(a, torch.Tensor) and a.device.type == "neuron" for a in args)


def _selecting_neuron(operator, ours, tensors_from: int) -> None:
    """Put `ours` on the operator's PrivateUse1 key and in front of its BackendSelect kernel, whose
    table of devices (cuda, cpu, hpu, xpu) raises for any other."""
    operator.py_impl(DispatchKey.PrivateUse1)(ours)
    select = operator.py_kernels[DispatchKey.BackendSelect]

    def backend_select(*args, **kwargs):
        return (ours if _on_neuron(args[tensors_from:]) else select)(*args, **kwargs)

    operator.py_kernels[DispatchKey.BackendSelect] = backend_select
    operator._dispatch_cache.clear()


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    _selecting_neuron(torch.ops.higher_order.run_and_save_rng_state, _run_and_save_rng_state, 1)
    _selecting_neuron(torch.ops.higher_order.run_with_rng_state, _run_with_rng_state, 2)
