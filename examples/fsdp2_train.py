"""FSDP2 training on NeuronCores, one process per core.

    torchrun --nproc-per-node=2 examples/fsdp2_train.py [--model gpt|mlp] [--steps 10]

Each rank shards every block and the root with `fully_shard`, trains on its slice of each batch
and prints the loss averaged over ranks. On the CPU platform TORCHNEURON_CORES must be at least
nproc-per-node (default 2).
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import torchneuron.distributed as tnd
from torchneuron.testing.models import MODELS, batches, loss_of


def shard(model: torch.nn.Module, kind: str) -> None:
    blocks = model.blocks if kind == "gpt" else [m for m in model.net if isinstance(m, torch.nn.Linear)]
    for block in blocks:
        fully_shard(block)
    fully_shard(model)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["mlp", "gpt"], default="mlp")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    device = tnd.init()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = MODELS[args.model]().to(device)
    shard(model, args.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step, (inputs, targets) in enumerate(batches(args.model, args.steps, batch=4 * world)):
        inputs, targets = inputs.chunk(world)[rank].to(device), targets.chunk(world)[rank].to(device)
        loss = loss_of(args.model, model, inputs, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        if rank == 0:
            print(f"step {step} loss {mean.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
