"""The GPT training step at real widths: neuron's modes against PyTorch CPU, inductor and jax.jit.

    python benchmarks/scale.py [--widths 64 256 768 1024] [--rounds 3] [--cases ...]

The GPT of torchneuron.testing.models with 4 layers, sequence 128, batch 8 and a 4,096-token
vocabulary (heads of 64 dimensions), one AdamW step (forward, backward, update) per call, on:
neuron fused eager (the default), strict eager, torch.compile(backend="neuron") and
torchneuron.capture; PyTorch CPU eager and inductor; the same model as one jax.jit function (the
ceiling our executables could reach). Per case and width: ms per step (fastest of interleaved rounds
after warm-up, timing.py), achieved GFLOP/s and its share of this machine's sgemm rate (PyTorch CPU
at 2048^2, measured in the same run), the first step's seconds (compiles included) and neuron's peak
device memory. A ratio column divides each step by CPU eager's at that width.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch._dynamo
from compile import jax_case, own_code
from timing import interleaved_seconds_per_call, sync_for

import torchneuron
from torchneuron.runtime import executables
from torchneuron.testing.models import GPT, train_step

LAYERS, SEQUENCE, BATCH, VOCAB, HEAD_DIM = 4, 128, 8, 4096, 64
CASES = ("cpu eager", "cpu inductor", "neuron fused", "neuron strict", "neuron compiled", "neuron captured",
         "jax.jit")


def sgemm_gflops(n: int = 2048, repeat: int = 5) -> float:
    """PyTorch CPU's float32 matmul rate at n x n (the machine's reference peak), best of `repeat`."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_seconds(lambda: a @ b) for _ in range(repeat))
    return 2 * n ** 3 / best / 1e9


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def step_flops(width: int) -> float:
    """A training step's multiply-adds x2 (forward) x3 (forward and backward): every Linear, the tied
    head and attention's two products (causal masking not subtracted, as libraries count it)."""
    tokens = BATCH * SEQUENCE
    per_layer = 3 * width * width + width * width + 2 * 4 * width * width  # qkv, proj, MLP up and down
    matmul_params = LAYERS * per_layer + VOCAB * width
    attention = LAYERS * 2 * SEQUENCE * width  # per token: q @ k^T and weights @ v
    return 3 * 2 * tokens * (matmul_params + attention)


def model_and_data(width: int):
    torch.manual_seed(0)
    model = GPT(vocab=VOCAB, width=width, heads=max(width // HEAD_DIM, 1), layers=LAYERS, context=SEQUENCE)
    generator = torch.Generator().manual_seed(1)
    data = [torch.randint(0, VOCAB, (BATCH, SEQUENCE), generator=generator) for _ in range(2)]
    return model, data


def torch_case(width: int, device: str, mode: str | None = None, compiled: str | None = None,
               captured: bool = False):
    model, (x, y) = model_and_data(width)
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = x.to(device), y.to(device)

    def step(x, y):
        return train_step("gpt", model, opt, x, y)

    if compiled:
        step = torch.compile(own_code(step), backend=compiled)
    elif captured:
        step = torchneuron.capture(step)
    sync = sync_for(device)

    def call():
        if mode is None:
            return step(x, y)
        with torchneuron.eager_mode(mode):
            return step(x, y)

    first = _seconds(lambda: (call(), sync()))
    if device == "neuron":  # eager's steady state: quick programs promoted, promotions finished
        for _ in range(executables._BACKGROUND_AFTER + 1):
            call()
        sync()
        executables.wait_for_promotions()
    return first, call, sync


def jax_step(width: int):
    model, data = model_and_data(width)
    (first, step, sync), _ = jax_case(model=model, data=data)
    return first, step, sync


def build(name: str, width: int):
    builders = {
        "cpu eager": lambda: torch_case(width, "cpu"),
        "cpu inductor": lambda: torch_case(width, "cpu", compiled="inductor"),
        "neuron fused": lambda: torch_case(width, "neuron", mode="fused"),
        "neuron strict": lambda: torch_case(width, "neuron", mode="strict"),
        "neuron compiled": lambda: torch_case(width, "neuron", compiled="neuron"),
        "neuron captured": lambda: torch_case(width, "neuron", captured=True),
        "jax.jit": lambda: jax_step(width),
    }
    return builders[name]()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 256, 768, 1024])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    peak = sgemm_gflops()
    print(f"sgemm (PyTorch CPU, 2048^2): {peak:.0f} GFLOP/s")
    print(f"{'width':>5} {'case':16} {'ms/step':>9} {'x cpu':>6} {'GFLOP/s':>8} {'% sgemm':>7} {'1st s':>6} "
          f"{'peak MB':>8}")
    for width in args.widths:
        built, firsts, peaks = {}, {}, {}
        for name in args.cases:
            torch._dynamo.reset()
            torch.neuron.reset_peak_memory_stats()
            try:
                firsts[name], call, sync = build(name, width)
            except (torch._dynamo.exc.BackendCompilerFailed, RuntimeError, OSError) as e:  # inductor: C++
                print(f"{width:5} {name:16} skipped ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
                continue
            built[name] = (call, sync)
            peaks[name] = torch.neuron.max_memory_allocated() / 2 ** 20 if name.startswith("neuron") else None
        seconds = interleaved_seconds_per_call(built, repeat=1, rounds=args.rounds, warmup=1)
        flops = step_flops(width)
        baseline = seconds.get("cpu eager")
        for name, s in seconds.items():
            ratio = f"{s / baseline:6.2f}" if baseline else f"{'-':>6}"
            memory = f"{peaks[name]:8.1f}" if peaks[name] is not None else f"{'-':>8}"
            rate = flops / s / 1e9
            print(f"{width:5} {name:16} {s * 1e3:9.1f} {ratio} {rate:8.1f} {100 * rate / peak:7.1f} "
                  f"{firsts[name]:6.1f} {memory}", flush=True)


if __name__ == "__main__":
    main()
