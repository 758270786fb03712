"""Fused eager against strict eager, PyTorch CPU and the compiled step, measured in the same run.

    python benchmarks/fused_eager.py

1. A loop of 1,000 dependent 64-element ops (`x = x * 1.001 + 0.001`, alternating mul and add),
   synchronized at the end: µs per op on PyTorch CPU, neuron strict and neuron fused (the whole loop
   is one recorded segment, one program).
2. The small GPT's training step (forward, backward, AdamW; the model of benchmarks/compile.py):
   ms per step in neuron strict eager, fused eager (one segment per step, cut at optimizer.step),
   torch.compile(backend="neuron"), the step captured once and replayed (`torchneuron.capture`,
   AdamW(capturable=True) as CUDA graphs require), and the same model as a jax.jit step; and the
   forward at batch 1 replayed against jax.jit. The first capture's seconds (warm-up call + record).
Each case first runs until its programs are compiled (eager: until its quick programs are promoted to
full optimisation, and the promotions have finished); cases are timed in interleaved rounds, each
reporting its fastest round (timing.py).
"""
from __future__ import annotations

import time

import torch
from compile import jax_case
from timing import interleaved_seconds_per_call, sync_for

import torchneuron
from torchneuron.runtime import executables
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


def gpt_step(device: str, mode: str | None = None, compiled: bool = False, captured: bool = False):
    torch.manual_seed(0)
    model = GPT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=captured)
    x, y = (t.to(device) for t in next(iter(batches("gpt", 1, batch=4))))

    def step(x, y):
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    if compiled:
        step = torch.compile(step, backend="neuron")
    elif captured:
        step = torchneuron.capture(step)
        started = time.perf_counter()
        step(x, y)
        step(x, y)
        torch.neuron.synchronize()
        print(f"first capture of the GPT step: {time.perf_counter() - started:.2f} s")

    def run():
        return step(x, y)

    def in_mode():
        with torchneuron.eager_mode(mode) if mode else _nothing():
            return run()

    if mode is not None:  # eager's steady state: its programs promoted to full optimisation after 16 calls
        _settle(in_mode)
    return in_mode, sync_for(device)


def _settle(fn) -> None:
    """Call `fn` until its quick programs are promoted, and wait for the promotions: a promotion
    still compiling on the worker thread would share the two cores with the timed calls."""
    for _ in range(executables._BACKGROUND_AFTER + 1):
        fn()
    torch.neuron.synchronize()
    executables.wait_for_promotions()


def gpt_forward():
    torch.manual_seed(0)
    model = GPT().to("neuron").eval()
    x = next(iter(batches("gpt", 1, batch=1)))[0].to("neuron")

    @torchneuron.capture
    def forward(x):
        with torch.no_grad():
            return model(x)

    return (lambda: forward(x)), sync_for("neuron")


def main():
    loops = {"cpu": op_loop("cpu", None), "neuron strict": op_loop("neuron", "strict"),
             "neuron fused": op_loop("neuron", "fused")}
    for name in ("neuron strict", "neuron fused"):
        _settle(loops[name][0])
    per_loop = interleaved_seconds_per_call(loops, 3, 8, warmup=2)
    print(f"{OPS} dependent 64-element ops, synchronized at the end (µs per op, x CPU):")
    for name, seconds in per_loop.items():
        print(f"  {name:14} {seconds / OPS * 1e6:8.2f} µs {seconds / per_loop['cpu']:7.2f}x")

    (_, jax_step, jax_sync), _ = jax_case()
    _, (_, jax_forward, jax_forward_sync) = jax_case(batch=1)
    steps = {"jax.jit": (jax_step, jax_sync), "neuron strict": gpt_step("neuron", "strict"),
             "neuron fused": gpt_step("neuron", "fused"), "neuron compiled": gpt_step("neuron", compiled=True),
             "neuron captured": gpt_step("neuron", captured=True)}
    per_step = interleaved_seconds_per_call(steps, 10, 10, warmup=3)
    print("small GPT training step (ms, x neuron compiled, x jax.jit):")
    for name, seconds in per_step.items():
        print(f"  {name:16} {seconds * 1e3:8.3f} ms {seconds / per_step['neuron compiled']:7.2f}x "
              f"{seconds / per_step['jax.jit']:7.2f}x")
    executables.wait_for_promotions()  # (the training steps' last ones)
    forwards = {"jax.jit": (jax_forward, jax_forward_sync), "neuron captured": gpt_forward()}
    per_forward = interleaved_seconds_per_call(forwards, 10, 10, warmup=3)
    print("small GPT forward, batch 1 (ms, x jax.jit):")
    for name, seconds in per_forward.items():
        print(f"  {name:16} {seconds * 1e3:8.3f} ms {seconds / per_forward['jax.jit']:7.2f}x")
    stats = torchneuron.eager_stats()
    print(f"fused: {stats['segments']} segments run, {stats['segment_compiles']} compiled, "
          f"{torchneuron.cache_stats()['promotions']} promotions in all, flushes {stats['flushes']}")


if __name__ == "__main__":
    main()
