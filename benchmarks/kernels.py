"""Fused attention: the small GPT's eager forward on neuron with the fused SDPA lowering against
the same forward on PyTorch's math path (sdpa_kernel(SDPBackend.MATH)), measured in the same run.

    python benchmarks/kernels.py

The GPT (torchneuron/testing/models.py) calls F.scaled_dot_product_attention(is_causal=True):
2 layers, width 64, 4 heads, sequence 128, batch 4, eval mode. Also a forward and backward.
Both paths are timed in alternating rounds, each reporting its fastest round (see timing.py).
"""
from __future__ import annotations

import torch
from timing import interleaved_seconds_per_call, sync_for
from torch.nn.attention import SDPBackend, sdpa_kernel

import torchneuron  # noqa: F401
from torchneuron.testing.models import GPT

SEQUENCE, BATCH = 128, 4


def _model_and_ids():
    torch.manual_seed(0)
    model = GPT(vocab=64, width=64, heads=4, layers=2, context=SEQUENCE).to("neuron").eval()
    ids = torch.randint(0, 64, (BATCH, SEQUENCE)).to("neuron")
    return model, ids


def _on(backends, fn):
    def run():
        with sdpa_kernel(backends):
            return fn()
    return run


def cases() -> dict:
    model, ids = _model_and_ids()
    sync = sync_for("neuron")

    def forward():
        with torch.no_grad():
            return model(ids)

    def forward_backward():
        model(ids, ids).backward()

    fused = [SDPBackend.OVERRIDEABLE, SDPBackend.MATH]
    return {
        ("forward", "fused"): (_on(fused, forward), sync),
        ("forward", "math"): (_on(SDPBackend.MATH, forward), sync),
        ("forward+backward", "fused"): (_on(fused, forward_backward), sync),
        ("forward+backward", "math"): (_on(SDPBackend.MATH, forward_backward), sync),
    }


def main() -> None:
    best = interleaved_seconds_per_call(cases(), repeat=10, rounds=7, warmup=3)
    print(f"small GPT on neuron, eager, sequence {SEQUENCE}, batch {BATCH}: ms per call")
    print(f"{'':18}{'fused SDPA':>12}{'math path':>12}{'math / fused':>14}")
    for what in ("forward", "forward+backward"):
        fused, math = best[(what, "fused")] * 1e3, best[(what, "math")] * 1e3
        print(f"{what:18}{fused:12.3f}{math:12.3f}{math / fused:14.2f}")


if __name__ == "__main__":
    main()
