"""Fused eager against strict eager, PyTorch CPU and the compiled step, measured in the same run.

    python benchmarks/fused_eager.py

1. A loop of 1,000 dependent 64-element ops (`x = x * 1.001 + 0.001`, alternating mul and add),
   synchronized at the end: µs per op on PyTorch CPU, neuron strict and neuron fused (the whole loop
   is one recorded segment, one program).
2. The small GPT's training step (forward, backward, AdamW; the model of benchmarks/compile.py):
   ms per step in neuron strict eager, fused eager (one segment per step, cut at optimizer.step) and
   torch.compile(backend="neuron") (benchmarks/compile.py compares that with CPU and jax.jit).
Each case first runs until its programs are compiled; cases are timed in interleaved rounds, each
reporting its fastest round (timing.py).
"""
from __future__ import annotations

import torch
from timing import interleaved_seconds_per_call, sync_for

import torchneuron
from torchneuron.testing.models import GPT, batches

OPS = 1000


def op_loop(device: str, mode: str | None):
    x0 = torch.randn(64).to(device)

    def loop():
        with torchneuron.eager_mode(mode) if mode else _nothing():
            x = x0
            for _ in range(OPS // 2):
                x = x * 1.001 + 0.001
            return x

    return loop, sync_for(device)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def gpt_step(device: str, mode: str | None = None, compiled: bool = False):
    torch.manual_seed(0)
    model = GPT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = (t.to(device) for t in next(iter(batches("gpt", 1, batch=4))))

    def step():
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    run = torch.compile(step, backend="neuron") if compiled else step

    def in_mode():
        with torchneuron.eager_mode(mode) if mode else _nothing():
            return run()

    return in_mode, sync_for(device)


def main():
    loops = {"cpu": op_loop("cpu", None), "neuron strict": op_loop("neuron", "strict"),
             "neuron fused": op_loop("neuron", "fused")}
    per_loop = interleaved_seconds_per_call(loops, 3, 8, warmup=2)
    print(f"{OPS} dependent 64-element ops, synchronized at the end (µs per op, x CPU):")
    for name, seconds in per_loop.items():
        print(f"  {name:14} {seconds / OPS * 1e6:8.2f} µs {seconds / per_loop['cpu']:7.2f}x")

    steps = {"neuron strict": gpt_step("neuron", "strict"),
             "neuron fused": gpt_step("neuron", "fused"), "neuron compiled": gpt_step("neuron", compiled=True)}
    per_step = interleaved_seconds_per_call(steps, 10, 10, warmup=3)
    print("small GPT training step (ms, x neuron compiled):")
    for name, seconds in per_step.items():
        print(f"  {name:16} {seconds * 1e3:8.3f} ms {seconds / per_step['neuron compiled']:7.2f}x")
    stats = torchneuron.eager_stats()
    print(f"fused: {stats['segments']} segments run, {stats['segment_compiles']} compiled, "
          f"flushes {stats['flushes']}")


if __name__ == "__main__":
    main()
