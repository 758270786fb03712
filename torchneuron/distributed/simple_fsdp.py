"""SimpleFSDP: fully sharded data parallel written as DTensor parametrizations, made for torch.compile.

    model = simple_fsdp.data_parallel(model, init_device_mesh("neuron", (world,)))
    step = torch.compile(train_step, backend="neuron")

Every parameter is stored sharded along dim 0 (`Shard(0)` on the mesh), so each rank holds a
1/world slice of the weights, gradients and optimizer state. A parametrization gathers the full
parameter where the forward reads it: the all-gather is a DTensor redistribution, so torch.compile
traces it as a functional collective into the graph (the backend issues it early and waits for it
late), and its backward, the gradient's reduce-scatter averaged over the ranks, is in the backward
graph. FSDP2's `fully_shard` does the same with hooks, which torch.compile cannot trace; this is the
compile-first form (the idea of TorchTitan's SimpleFSDP, written for our backend).

The optimizer steps on the sharded parameters (DTensors). The gradient is averaged, as FSDP2 and
DDP do: train on each rank's share of the batch with a mean loss.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DeviceMesh, DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.nn.utils import parametrize


class _Gathered(nn.Module):
    """The parametrization: the full parameter, gathered from its shards; its gradient flows back as
    a partial (per-rank) sum to average and scatter."""

    def forward(self, sharded: DTensor) -> torch.Tensor:
        return sharded.redistribute(placements=[Replicate()]).to_local(grad_placements=[Partial("avg")])


def data_parallel(model: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Shard every parameter of `model` (in place) over the 1-d `mesh`; returns `model`."""
    if mesh.ndim != 1:
        raise ValueError(f"simple_fsdp.data_parallel needs a 1-d mesh, got {mesh.ndim} dimensions")
    sharded: dict[int, nn.Parameter] = {}  # tied parameters (a GPT's head and embedding) stay tied
    for module in list(model.modules()):
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in sharded:
                sharded[id(param)] = nn.Parameter(distribute_tensor(param.detach(), mesh, [Shard(0)]),
                                                  requires_grad=param.requires_grad)
            module.register_parameter(name, sharded[id(param)])
            parametrize.register_parametrization(module, name, _Gathered(), unsafe=True)
    return model


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter gathered in full, detached, under its name before `data_parallel`."""
    state = {}
    for name, p in model.named_parameters():
        name = name.replace("parametrizations.", "").replace(".original", "")
        state[name] = p.full_tensor().detach() if isinstance(p, DTensor) else p.detach()
    return state
