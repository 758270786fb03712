"""Kernels from Python, eager on neuron, each against what it replaces, measured in the same run:

- fused attention: the small GPT's forward (and forward + backward) with the fused SDPA lowering
  against the same model on PyTorch's math path (sdpa_kernel(SDPBackend.MATH));
- a user RMSNorm written as one `torchneuron.jax_op` against the same expression in PyTorch ops;
- FlexAttention with a causal BlockMask against SDPA with an explicit causal mask, both compiled
  (`torch.compile(backend="neuron")`): forward and backward visit only the blocks the mask lists
  (36 of 64 here).

    python benchmarks/kernels.py

The GPT is the compile benchmark's (torchneuron/testing/models.py: 2 layers, width 32, 4 heads) at
sequence 128, batch 4, eval mode; it calls F.scaled_dot_product_attention(is_causal=True). Cases are
timed in alternating rounds, each reporting its fastest round (see timing.py), after a warm-up long
enough for every op's executable to reach its steady state (eager programs compile quickly first and
recompile at full optimisation once their calls add up: runtime/executables.py, `_Tiered`). Neuron
runs in strict eager, each op as it is called, so every kernel runs: in fused eager, the default, a
result nobody reads is never computed.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from timing import interleaved_seconds_per_call, sync_for
from torch.nn.attention import SDPBackend, sdpa_kernel

import torchneuron
from torchneuron.testing.models import GPT

SEQUENCE, BATCH = 128, 4
WARMUP = 300  # calls of each case before timing: past the last tier check that promotes (256)


def _model_and_ids():
    torch.manual_seed(0)
    model = GPT(context=SEQUENCE).to("neuron").eval()
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


@torchneuron.jax_op("benchmarks::rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * weight


def composed_rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight


def rms_norm_cases() -> dict:
    """The RMSNorm of the GPT's activations (batch x sequence rows of width 32), forward and backward."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, SEQUENCE, 32, generator=g).to("neuron").requires_grad_()
    weight = torch.randn(32, generator=g).to("neuron").requires_grad_()
    sync = sync_for("neuron")

    def forward(fn):
        def run():
            with torch.no_grad():
                return fn(x, weight, 1e-6)
        return run

    def forward_backward(fn):
        return lambda: fn(x, weight, 1e-6).sum().backward()

    return {("rms_norm forward", "jax_op"): (forward(rms_norm), sync),
            ("rms_norm forward", "composed"): (forward(composed_rms_norm), sync),
            ("rms_norm forward+backward", "jax_op"): (forward_backward(rms_norm), sync),
            ("rms_norm forward+backward", "composed"): (forward_backward(composed_rms_norm), sync)}


FLEX_SHAPE, FLEX_BLOCK = (1, 4, 1024, 32), 128  # (batch, heads, sequence, head dim), BlockMask's block


def flex_attention_cases() -> dict:
    """Causal attention of FLEX_SHAPE queries, keys and values, compiled: flex_attention with a causal
    BlockMask, and SDPA with the same mask as an explicit boolean tensor; forward, forward+backward."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(FLEX_SHAPE, generator=g).to("neuron").requires_grad_() for _ in range(3))
    length = FLEX_SHAPE[2]
    block_mask = create_block_mask(lambda b, h, i, j: i >= j, 1, 1, length, length, device="neuron",
                                   BLOCK_SIZE=FLEX_BLOCK)
    mask = torch.ones(length, length, dtype=torch.bool).tril().to("neuron")
    flex = torch.compile(lambda q, k, v: flex_attention(q, k, v, block_mask=block_mask), backend="neuron")
    sdpa = torch.compile(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                         backend="neuron")
    sync = sync_for("neuron")

    def forward(fn):
        def run():
            with torch.no_grad():
                return fn(q, k, v)
        return run

    def forward_backward(fn):
        return lambda: fn(q, k, v).sum().backward()

    return {("flex forward", "flex"): (forward(flex), sync),
            ("flex forward", "sdpa"): (forward(sdpa), sync),
            ("flex forward+backward", "flex"): (forward_backward(flex), sync),
            ("flex forward+backward", "sdpa"): (forward_backward(sdpa), sync)}


def main() -> None:
    with torchneuron.eager_mode("strict"):
        best = interleaved_seconds_per_call({**cases(), **rms_norm_cases(), **flex_attention_cases()}, repeat=10,
                                            rounds=7, warmup=WARMUP)
    print(f"small GPT on neuron, eager, sequence {SEQUENCE}, batch {BATCH}: ms per call")
    print(f"{'':28}{'fused SDPA':>12}{'math path':>12}{'math / fused':>14}")
    for what in ("forward", "forward+backward"):
        fused, math = best[(what, "fused")] * 1e3, best[(what, "math")] * 1e3
        print(f"{what:28}{fused:12.3f}{math:12.3f}{math / fused:14.2f}")
    print(f"\nRMSNorm of ({BATCH}, {SEQUENCE}, 32) on neuron, eager: ms per call")
    print(f"{'':28}{'jax_op':>12}{'composed':>12}{'composed / op':>14}")
    for what in ("rms_norm forward", "rms_norm forward+backward"):
        op, composed = best[(what, "jax_op")] * 1e3, best[(what, "composed")] * 1e3
        print(f"{what:28}{op:12.3f}{composed:12.3f}{composed / op:14.2f}")
    print(f"\ncausal attention {FLEX_SHAPE} on neuron, compiled: ms per call (BlockMask blocks of {FLEX_BLOCK})")
    print(f"{'':28}{'flex':>12}{'SDPA+mask':>12}{'SDPA / flex':>14}")
    for what in ("flex forward", "flex forward+backward"):
        flex, sdpa = best[(what, "flex")] * 1e3, best[(what, "sdpa")] * 1e3
        print(f"{what:28}{flex:12.3f}{sdpa:12.3f}{sdpa / flex:14.2f}")


if __name__ == "__main__":
    main()
