"""Judging a float32 training run by a float64 shadow of each of its steps.

Two float32 runs of the same training (CPU and neuron, or CPU on two x86-64 machines whose kernels
differ by CPU features) drift apart: rounding differences are amplified by Adam's normalisation of
near-zero gradients and by near-ties in ReLU and max pooling (a parameter 1e-7 away can route a
gradient elsewhere). How far two whole curves drift is a property of the machine, not of the
backend. One step's error is not: every step here restarts a float64 CPU model and a float32 CPU
model from the run's own parameters and optimizer state, takes the same step, and measures how far
each float32 step (neuron's and CPU's) lands from the float64 one. Neuron passes when its error is
no larger than CPU's times a small factor plus a floor of a few float32 roundings, the rule the
conformance tool applies to half-precision results (`conformance/classify.closer_to_float64`).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch.utils._pytree import tree_map

from .models import MODELS, OPTIMIZERS, batches, train_step

FLOAT32_EPS = torch.finfo(torch.float32).eps


@dataclasses.dataclass
class StepErrors:
    """Per step, distances from the float64 step: of the loss, and of the parameters after the update
    (root mean square over every parameter), for neuron's float32 step and CPU's."""

    losses: list[float] = dataclasses.field(default_factory=list)
    neuron_loss: list[float] = dataclasses.field(default_factory=list)
    cpu_loss: list[float] = dataclasses.field(default_factory=list)
    param_scale: list[float] = dataclasses.field(default_factory=list)
    neuron_params: list[float] = dataclasses.field(default_factory=list)
    cpu_params: list[float] = dataclasses.field(default_factory=list)
    model: torch.nn.Module | None = None  # the trained neuron model and its optimizer
    optimizer: torch.optim.Optimizer | None = None

    def failures(self, factor: float = 4.0, ulps: float = 4.0) -> list[str]:
        """Steps where neuron lands further from float64 than `factor` times CPU does, plus `ulps`
        float32 roundings of the value's magnitude."""
        out = []
        for i, (loss, n, c) in enumerate(zip(self.losses, self.neuron_loss, self.cpu_loss)):
            if not n <= factor * c + ulps * FLOAT32_EPS * abs(loss):  # NaN fails too
                out.append(f"step {i}: loss {n:.3g} from float64's, CPU's {c:.3g}")
        for i, (scale, n, c) in enumerate(zip(self.param_scale, self.neuron_params, self.cpu_params)):
            if not n <= factor * c + ulps * FLOAT32_EPS * scale:
                out.append(f"step {i}: parameters {n:.3g} (rms) from float64's, CPU's {c:.3g}")
        return out


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().cpu().double().reshape(-1) for p in model.parameters()])


def _rms(x: torch.Tensor) -> float:
    return float(x.square().mean().sqrt()) if x.numel() else 0.0


def _on_cpu(state: dict) -> dict:
    """An optimizer state dict for CPU parameters. A copy for each shadow: loading casts the moments
    to the parameters' dtype but takes step counts as they are, and the step increments them in place;
    step counts on the device (a compiled optimizer is capturable) become CPU ones."""
    state = tree_map(lambda v: v.cpu().clone() if isinstance(v, torch.Tensor) else v, state)
    for group in state["param_groups"]:
        if "capturable" in group:
            group["capturable"] = False
    return state


def shadowed_training(kind: str, steps: int, optimizer: str = "adamw", lr: float = 1e-2, seed: int = 0,
                      step: Callable | None = None) -> StepErrors:
    """Train `kind` on neuron for `steps` steps (`step(kind, model, opt, inputs, targets)` -> loss,
    default `train_step`; e.g. a compiled one) and shadow every step on CPU in float64 and float32."""
    step = step or train_step
    torch.manual_seed(seed)
    model = MODELS[kind]().to("neuron")
    opt = OPTIMIZERS[optimizer](model.parameters(), lr)
    errors = StepErrors()
    for inputs, targets in batches(kind, steps, seed=seed):
        params = {k: v.cpu() for k, v in model.state_dict().items()}
        shadows = {}
        for dtype in (torch.float64, torch.float32):
            shadow = MODELS[kind]().to(dtype)
            shadow.load_state_dict(params)
            shadow_opt = OPTIMIZERS[optimizer](shadow.parameters(), lr)
            shadow_opt.load_state_dict(_on_cpu(opt.state_dict()))
            x = inputs.to(dtype) if inputs.is_floating_point() else inputs
            shadows[dtype] = (train_step(kind, shadow, shadow_opt, x, targets).item(), _flat(shadow))
        loss = step(kind, model, opt, inputs.to("neuron"), targets.to("neuron")).item()
        (ref_loss, ref), (cpu_loss, cpu) = shadows[torch.float64], shadows[torch.float32]
        errors.losses.append(ref_loss)
        errors.neuron_loss.append(abs(loss - ref_loss) if math.isfinite(loss) else math.inf)
        errors.cpu_loss.append(abs(cpu_loss - ref_loss))
        errors.param_scale.append(_rms(ref))
        errors.neuron_params.append(_rms(_flat(model) - ref))
        errors.cpu_params.append(_rms(cpu - ref))
    errors.model, errors.optimizer = model, opt
    return errors
