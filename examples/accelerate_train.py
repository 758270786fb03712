"""accelerate's documented pattern on neuron: the optimizer is built on the CPU model, then
`Accelerator().prepare(model, optimizer, loader)` moves the model to the device.

    python examples/accelerate_train.py [--steps 10] [--cpu]
    torchrun --nproc-per-node=2 examples/accelerate_train.py

accelerate picks neuron by itself (one process: neuron:0; under torchrun: neuron:LOCAL_RANK, DDP
with the c10d backend "neuron"). The optimizer keeps the very Parameter objects the model trains,
as on CUDA, so the weights move. Rank 0 prints each step's loss, and as its last line a JSON record
of the run (device, losses, how far the weights moved) that tests compare with the same run on CPU.
"""
from __future__ import annotations

import argparse
import json

import accelerate
import torch

from torchneuron.testing.models import MLP


def data(samples: int = 64, seed: int = 0) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, 16, generator=generator)
    return torch.utils.data.TensorDataset(inputs, (inputs[:, :4].sum(1) > 0).long())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--cpu", action="store_true", help="the same run on CPU, for comparison")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # before the move: accelerate's pattern
    loader = torch.utils.data.DataLoader(data(), batch_size=8, shuffle=False)
    accelerator = accelerate.Accelerator(cpu=args.cpu)
    start = [p.detach().cpu().clone() for p in model.parameters()]
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    losses = []
    batches = iter(loader)
    for step in range(args.steps):
        try:
            inputs, targets = next(batches)
        except StopIteration:
            batches = iter(loader)
            inputs, targets = next(batches)
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
        accelerator.print(f"step {step} loss {losses[-1]:.4f}")

    moved = sum((p.detach().cpu() - s).abs().sum().item()
                for p, s in zip(accelerator.unwrap_model(model).parameters(), start))
    accelerator.print(json.dumps({"device": str(accelerator.device), "processes": accelerator.num_processes,
                                  "losses": losses, "weights_moved": moved}))


if __name__ == "__main__":
    main()
