"""`make demo`: train the same small model on CPU and on neuron; the only change is `.to("neuron")`.

Prints the loss every few steps on both devices and how closely they agree.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import torchneuron
from torchneuron.testing.models import GPT, batches

STEPS = 300


def train(device: str) -> list[float]:
    torch.manual_seed(0)
    model = GPT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for inputs, targets in batches("gpt", STEPS, batch=8):
        logits = model(inputs.to(device))
        loss = F.cross_entropy(logits.flatten(0, 1), targets.to(device).flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    print(f"torchneuron: {torch.neuron.device_count()} NeuronCores on PJRT platform "
          f"'{torchneuron.config.PLATFORM}'; training a 2-layer GPT for {STEPS} steps with AdamW")
    started = time.perf_counter()
    cpu = train("cpu")
    cpu_time = time.perf_counter() - started
    started = time.perf_counter()
    neuron = train("neuron")
    neuron_time = time.perf_counter() - started
    print(f"{'step':>6} {'cpu loss':>10} {'neuron loss':>12} {'rel diff':>9}")
    for step in list(range(0, STEPS, 25)) + [STEPS - 1]:
        c, n = cpu[step], neuron[step]
        print(f"{step:>6} {c:>10.5f} {n:>12.5f} {abs(c - n) / abs(c):>9.1e}")
    worst = max(abs(c - n) / abs(c) for c, n in zip(cpu, neuron))
    print(f"time: cpu {cpu_time:.1f} s, neuron {neuron_time:.1f} s (eager, first steps include compilation)")
    print(f"largest relative loss difference over {STEPS} steps: {worst:.1e}")
    print(f"ops that ran on CPU instead of neuron: {torchneuron.fallback_stats() or 'none'}")


if __name__ == "__main__":
    main()
