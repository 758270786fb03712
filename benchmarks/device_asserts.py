"""What device-side asserts cost: the same cases with index checks compiled in and without.

    python benchmarks/device_asserts.py

The setting is read at import (TORCHNEURON_DEVICE_ASSERTS), so each side runs in its own child
process; the two alternate for three rounds and each case reports its fastest round. Cases: an
eager gather and an embedding lookup of 64 indices, the small GPT's eager training step (AdamW,
embedding and cross-entropy checked) and its training step under torch.compile(backend="neuron").
The children run strict eager (TORCHNEURON_EAGER=strict), each op as it is called, so every checked
op runs: in fused eager, the default, a result nobody reads is never computed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROUNDS = 3


def measure() -> dict:
    """Seconds per call of each case, in this process (its setting)."""
    import torch
    from timing import interleaved_seconds_per_call

    import torchneuron  # noqa: F401
    from torchneuron.testing.models import GPT

    torch.manual_seed(0)
    sync = torch.neuron.synchronize
    x = torch.randn(64).to("neuron")
    table = torch.randn(256, 16).to("neuron")
    index = torch.randint(0, 64, (64,)).to("neuron")

    def gpt_step(compiled: bool):
        torch.manual_seed(0)
        model = GPT(vocab=64, width=32, heads=4, layers=2, context=16).to("neuron")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        idx = torch.randint(0, 64, (4, 16)).to("neuron")

        def loss():
            return model(idx, idx)

        forward = torch.compile(loss, backend="neuron") if compiled else loss

        def step():
            opt.zero_grad()
            forward().backward()
            opt.step()
        return step

    small = interleaved_seconds_per_call({
        "gather (64)": (lambda: x.gather(0, index), sync),
        "embedding (64 of 256x16)": (lambda: torch.nn.functional.embedding(index, table), sync),
    }, 1000, 10, 100)
    steps = interleaved_seconds_per_call({
        "GPT train step, eager": (gpt_step(False), sync),
        "GPT train step, compiled": (gpt_step(True), sync),
    }, 20, 5, 3)
    return {**small, **steps}


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    best: dict = {"1": {}, "0": {}}
    for _ in range(ROUNDS):
        for setting in ("1", "0"):
            env = {**os.environ, "TORCHNEURON_DEVICE_ASSERTS": setting, "TORCHNEURON_EAGER": "strict",
                   "PYTHONPATH": os.pathsep.join([here, os.path.dirname(here)])}
            out = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True,
                                 check=True)
            for name, seconds in json.loads(out.stdout.strip().splitlines()[-1]).items():
                best[setting][name] = min(best[setting].get(name, float("inf")), seconds)
    print(f"{'case':<28} {'checks off µs':>14} {'checks on µs':>13} {'on/off':>8}")
    for name, off in best["0"].items():
        on = best["1"][name]
        print(f"{name:<28} {off * 1e6:>14.1f} {on * 1e6:>13.1f} {on / off:>7.3f}x")


if __name__ == "__main__":
    if "--child" in sys.argv:
        print(json.dumps(measure()))
    else:
        main()
