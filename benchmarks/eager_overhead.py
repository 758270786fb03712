"""Eager overhead: µs per op on neuron and on PyTorch CPU, measured in the same run.

    python benchmarks/eager_overhead.py

Prints small (64-element) add, mul, sum and matmul, a 1024x1024 float32 matmul and a training step
of the small GPT (2 layers, width 32, 4 heads, sequence 16, batch 4, AdamW), with the ratio
neuron / CPU for each. CPU and neuron are timed in alternating rounds, each reporting its fastest
round (see timing.py: the machine's speed comes in phases).
Neuron runs in strict eager, each op as it is called: this is the cost of one op. In fused eager,
the default, an op whose result nobody reads is never computed (benchmarks/fused_eager.py times
fused eager on dependent ops and the training step, beside strict).
"""
from __future__ import annotations

import torch
from timing import interleaved_seconds_per_call, sync_for

import torchneuron
from torchneuron.testing.models import GPT


def small_ops(device: str) -> dict:
    """name -> (fn, sync) for the small ops on `device`."""
    torch.manual_seed(0)
    a, b = torch.randn(64).to(device), torch.randn(64).to(device)
    m1, m2 = torch.randn(8, 8).to(device), torch.randn(8, 8).to(device)
    sync = sync_for(device)
    return {
        "add (64)": (lambda: a + b, sync),
        "mul (64)": (lambda: a * b, sync),
        "sum (64)": (lambda: a.sum(), sync),
        "matmul (8x8)": (lambda: m1 @ m2, sync),
    }


def big_matmul(device: str):
    x, y = torch.randn(1024, 1024).to(device), torch.randn(1024, 1024).to(device)
    return lambda: x @ y, sync_for(device)


def gpt_step(device: str):
    torch.manual_seed(0)
    model = GPT(vocab=64, width=32, heads=4, layers=2, context=16).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 64, (4, 16)).to(device)
    targets = torch.randint(0, 64, (4, 16)).to(device)

    def step():
        loss = model(idx, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step, sync_for(device)


def paired(name: str, cpu_case, neuron_case, repeat: int, rounds: int) -> tuple:
    """(name, cpu µs, neuron µs), the two timed in alternating rounds."""
    best = interleaved_seconds_per_call({"cpu": cpu_case, "neuron": neuron_case}, repeat, rounds,
                                        warmup=max(3, repeat // 10))
    return name, best["cpu"] * 1e6, best["neuron"] * 1e6


def main() -> None:
    with torchneuron.eager_mode("strict"):
        rows = measure()
    print(f"{'op':<24} {'cpu µs':>12} {'neuron µs':>12} {'neuron/cpu':>11}")
    for name, c, n in rows:
        print(f"{name:<24} {c:>12.1f} {n:>12.1f} {n / c:>10.2f}x")


def measure() -> list:
    rows = []
    cpu, neuron = small_ops("cpu"), small_ops("neuron")
    rows += [paired(name, cpu[name], neuron[name], 1000, 15) for name in cpu]
    rows.append(paired("matmul 1024x1024 f32", big_matmul("cpu"), big_matmul("neuron"), 5, 6))
    rows.append(paired("GPT train step", gpt_step("cpu"), gpt_step("neuron"), 20, 6))
    return rows


if __name__ == "__main__":
    main()
