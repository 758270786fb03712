"""Eager overhead: µs per op on neuron and on PyTorch CPU, measured in the same run.

    python benchmarks/eager_overhead.py

Prints small (64-element) add, mul, sum and matmul, a 1024x1024 float32 matmul and a training step
of the small GPT (2 layers, width 32, 4 heads, sequence 16, batch 4, AdamW), with the ratio
neuron / CPU for each.
"""
from __future__ import annotations

import torch
from timing import seconds_per_call, sync_for

import torchneuron  # noqa: F401
from torchneuron.testing.models import GPT


def per_call_us(fn, device: str, repeat: int, rounds: int = 5) -> float:
    return seconds_per_call(fn, sync_for(device), repeat, rounds, warmup=max(3, repeat // 10)) * 1e6


def small_ops(device: str) -> dict[str, float]:
    a, b = torch.randn(64, device="cpu").to(device), torch.randn(64, device="cpu").to(device)
    m1, m2 = torch.randn(8, 8).to(device), torch.randn(8, 8).to(device)
    return {
        "add (64)": per_call_us(lambda: a + b, device, 2000),
        "mul (64)": per_call_us(lambda: a * b, device, 2000),
        "sum (64)": per_call_us(lambda: a.sum(), device, 2000),
        "matmul (8x8)": per_call_us(lambda: m1 @ m2, device, 2000),
    }


def big_matmul(device: str) -> float:
    x, y = torch.randn(1024, 1024).to(device), torch.randn(1024, 1024).to(device)
    return per_call_us(lambda: x @ y, device, 10)


def gpt_step(device: str) -> float:
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

    return per_call_us(step, device, 20)


def main() -> None:
    rows = []
    cpu, neuron = small_ops("cpu"), small_ops("neuron")
    rows += [(name, cpu[name], neuron[name]) for name in cpu]
    rows.append(("matmul 1024x1024 f32", big_matmul("cpu"), big_matmul("neuron")))
    rows.append(("GPT train step", gpt_step("cpu"), gpt_step("neuron")))
    print(f"{'op':<24} {'cpu µs':>12} {'neuron µs':>12} {'neuron/cpu':>11}")
    for name, c, n in rows:
        print(f"{name:<24} {c:>12.1f} {n:>12.1f} {n / c:>10.2f}x")


if __name__ == "__main__":
    main()
