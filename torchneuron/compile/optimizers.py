"""Compiled optimizers keep their step counts on neuron, as Dynamo arranges for CUDA.

When Dynamo compiles `optimizer.step()` before the optimizer has state, it sets the param
groups' `capturable` flag for CUDA and XPU parameters, so that `step` counts are created on the
device and the whole update, bias corrections included, is one device graph. For other devices it
leaves `capturable` off while tracing the capturable code path anyway: the step counts stay CPU
tensors, and every compiled step moves them to the device and their increments back (about half
a millisecond per step for the small GPT). PyTorch's capturable optimizers accept the
PrivateUse1 device, so neuron takes the CUDA rule.
"""
from __future__ import annotations

import functools

import torch


def _all_neuron_and_fresh(optimizer: torch.optim.Optimizer, group: dict) -> bool:
    params = group.get("params", [])
    return ("capturable" in group and bool(params)
            and all(p.device.type == "neuron" and p not in optimizer.state for p in params))


def install() -> None:
    """Wrap Dynamo's rule (torch 2.13: OptimizerVariable._set_capturable) once."""
    from torch._dynamo.variables.optimizer import OptimizerVariable

    original = OptimizerVariable._set_capturable
    if getattr(original, "_neuron", False):
        return

    @functools.wraps(original)
    def set_capturable(self, tx):
        for group in self.value.param_groups:
            if _all_neuron_and_fresh(self.value, group):
                group["capturable"] = True
        return original(self, tx)

    set_capturable._neuron = True
    OptimizerVariable._set_capturable = set_capturable
