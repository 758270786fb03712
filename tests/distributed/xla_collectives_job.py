"""Run under torchrun with TORCHNEURON_XLA_COLLECTIVES=1 (tests/distributed/test_distributed_compile.py): graphs
with collectives compile as one XLA program per rank, equal to the model on CPU. Each rank prints a marker naming it."""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import torchneuron.distributed as tnd
from torchneuron.compile.backend import compile_stats
from torchneuron.distributed import simple_fsdp
from torchneuron.runtime import devices
from torchneuron.testing.models import MODELS, NormMLP, batches, loss_of


def close(actual, expected):
    for a, e in zip(actual, expected, strict=True):
        a = a.full_tensor() if isinstance(a, DTensor) else a
        torch.testing.assert_close(a.detach().cpu(), e.detach(), rtol=1e-5, atol=1e-5)


def main():
    device = tnd.init()
    assert devices.MULTI_PROCESS
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("neuron", (world,))
    plans = [({"up": ColwiseParallel(), "down": RowwiseParallel()}, False),
             ({"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
               "down": RowwiseParallel(output_layouts=Shard(1))}, True)]
    for plan, sharded_input in plans:
        torch.manual_seed(0)
        reference, block = NormMLP(), NormMLP()
        block.load_state_dict(reference.state_dict())
        block = torch.compile(parallelize_module(block.to(device), mesh, plan), backend="neuron")
        x = torch.randn(2, 6, 8)
        out = block((x.chunk(world, dim=1)[rank] if sharded_input else x).to(device))
        out.sum().backward()
        ref = reference(x)
        ref.sum().backward()
        close([out, *[p.grad for p in block.parameters()]],
              [ref.chunk(world, dim=1)[rank] if sharded_input else ref, *[p.grad for p in reference.parameters()]])
    # SimpleFSDP, the whole step compiled
    torch.manual_seed(0)
    model = simple_fsdp.data_parallel(MODELS["gpt"]().to(device), mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @torch.compile(backend="neuron")
    def step(x, y):
        opt.zero_grad()
        loss_of("gpt", model, x, y).backward()
        opt.step()

    torch.manual_seed(0)
    reference = MODELS["gpt"]()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in batches("gpt", 2):
        step(x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device))
        ref_opt.zero_grad()
        loss_of("gpt", reference, x, y).backward()
        ref_opt.step()
    full = simple_fsdp.full_state(model)
    close([full[n] for n, _ in reference.named_parameters()], [p for _, p in reference.named_parameters()])
    stats = compile_stats()
    assert stats.get("spmd_graphs", 0) >= 6 and not stats.get("segmented_graphs") and not stats.get("eager_graphs"), stats
    dist.destroy_process_group()
    print(f"xla-collectives-rank-{rank}-ok", flush=True)


if __name__ == "__main__":
    main()
