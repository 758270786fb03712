"""PyTorch's `flex_attention` accepts neuron tensors.

`torch.nn.attention.flex_attention.flex_attention` checks the device against a fixed list (cuda,
cpu, xpu, hpu, mps) before any dispatch. We wrap that check (`_validate_device`) the moment the
module has run, so neuron passes and every other device gets PyTorch's own answer. Past the check,
eager calls run PyTorch's dense implementation of the higher-order op (its CompositeExplicitAutograd
kernel, which PrivateUse1 reaches) as neuron ops, and compiled graphs lower it
(compile/higher_order.py, lowering/flex_attention.py). docs/KERNELS.md says what is supported.
"""
from __future__ import annotations

import functools

MODULE = "torch.nn.attention.flex_attention"


def allow_neuron(module) -> None:
    """Wrap `module._validate_device` so neuron tensors pass it (once)."""
    check = getattr(module, "_validate_device", None)
    if check is None or hasattr(check, "torchneuron_wraps"):
        return

    @functools.wraps(check)
    def validate_device(query, key, value) -> None:
        if query.device.type != "neuron":
            check(query, key, value)

    validate_device.torchneuron_wraps = check
    module._validate_device = validate_device
