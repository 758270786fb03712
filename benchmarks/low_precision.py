"""Low precision on neuron against full precision, measured in the same run (docs/LOW_PRECISION.md):

- a training step of a GPT (forward, backward, AdamW) in float32, under bfloat16 autocast, and with
  torchao's float8 training (tensorwise and rowwise recipes: `torch._scaled_mm` as float8 dots);
- a decode-shaped forward (batch 1, a few tokens, no gradients) in float32, in bfloat16, and with
  torchao's int8 weight-only quantization.

    python benchmarks/low_precision.py

Every number is neuron's, eager (fused, the default), ms per call, with its ratio to the float32 case
of its kind (above 1: slower than float32). The GPT is torchneuron/testing/models.py's at width 256
(linears divisible by 16, as float8 matmuls want), 2 layers, 4 heads; the tied output head stays in
high precision. Cases are timed in alternating rounds, each reporting its fastest (timing.py). XLA:CPU
has no float8 or int8 matrix unit: it widens the operands, so what float8 adds here (scaling, casts)
is not paid back by a faster dot as on an FP8 accelerator; the ratios measure that overhead.
"""
from __future__ import annotations

import copy

import torch
from timing import interleaved_seconds_per_call, sync_for
from torchao.float8 import Float8LinearConfig, convert_to_float8_training
from torchao.quantization import Int8WeightOnlyConfig, quantize_

import torchneuron  # noqa: F401  (registers the device)
from torchneuron.testing.models import GPT

WIDTH, LAYERS, HEADS, CONTEXT = 256, 2, 4, 64
BATCH, DECODE_TOKENS = 8, 4


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(width=WIDTH, heads=HEADS, layers=LAYERS, context=CONTEXT)


def _not_head(module, fqn) -> bool:
    return fqn != "head"


def _float8(recipe: str) -> GPT:
    model = _gpt()
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe), module_filter_fn=_not_head)
    return model


def _train_step(model: GPT, autocast_dtype=None):
    model = model.to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (BATCH, CONTEXT + 1), generator=g).to("neuron")

    def step():
        with torch.autocast("neuron", dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            loss = model(ids[:, :-1], ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def _decode(model: GPT):
    model = model.to("neuron").eval()
    ids = torch.randint(0, 64, (1, DECODE_TOKENS)).to("neuron")

    def forward():
        with torch.no_grad():
            return model(ids)
    return forward


def _int8_weight_only() -> GPT:
    model = _gpt().to("neuron")
    quantize_(model, Int8WeightOnlyConfig(), filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and _not_head(m, fqn))
    return model


def cases() -> dict:
    sync = sync_for("neuron")
    return {
        ("train step", "float32"): (_train_step(_gpt()), sync),
        ("train step", "bfloat16 autocast"): (_train_step(_gpt(), torch.bfloat16), sync),
        ("train step", "float8 tensorwise"): (_train_step(_float8("tensorwise")), sync),
        ("train step", "float8 rowwise"): (_train_step(_float8("rowwise")), sync),
        ("decode forward", "float32"): (_decode(_gpt()), sync),
        ("decode forward", "bfloat16"): (_decode(copy.deepcopy(_gpt()).bfloat16()), sync),
        ("decode forward", "int8 weight-only"): (_decode(_int8_weight_only()), sync),
    }


def main() -> None:
    best = interleaved_seconds_per_call(cases(), repeat=5, rounds=5, warmup=5)
    print(f"GPT width {WIDTH}, {LAYERS} layers, on neuron (eager): train step batch {BATCH} x {CONTEXT}, "
          f"decode forward 1 x {DECODE_TOKENS}; ms per call, ratio to float32")
    for kind in ("train step", "decode forward"):
        base = best[(kind, "float32")]
        for (k, name), seconds in best.items():
            if k == kind:
                print(f"{kind:16}{name:22}{seconds * 1e3:10.2f}{seconds / base:8.2f}")


if __name__ == "__main__":
    main()
