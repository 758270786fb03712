"""The host numbers of optimizers in a recorded step: refused, made device values, or checked at replay.

A recording (graphs.py) replays device work only. An optimizer keeps numbers on the host that its
step reads: with `capturable=False` (the default) Adam's step count lives in CPU tensors and its bias
corrections are Python floats, and every optimizer reads its learning rate, betas and weight decay
from `param_groups` as Python numbers. A replay would reuse the values of the recording forever:
silently stale training. So, as CUDA does and more:

- a step of an optimizer whose `param_groups` say `capturable=False` inside a capture raises CUDA's
  error (`Optimizer._cuda_graph_capture_health_check`, which only looks at CUDA's own captures);
- `torchneuron.capture` makes the optimizers its warm-up calls step capturable (step counts moved to
  the device, `capturable=True`; Adam's and AdamW's learning rates become device tensors, which
  schedulers fill in place), so that its recording reads them afresh at each replay;
- the host values of the optimizers a recording stepped, and the training mode of the modules it
  called (`HostValues`), are compared before each replay: `torchneuron.capture` records the step again
  when one changed (a scheduler's new learning rate, `model.eval()`), a `NeuronGraph` refuses to
  replay.
"""
from __future__ import annotations

import threading

import torch

from .runtime import deferred

_state = threading.local()  # .watched: (optimizer, host values) stepped in the recording; .warming


def _stepping(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    if deferred.capturing():
        if not all(group.get("capturable", True) for group in optimizer.param_groups):
            raise RuntimeError(
                f"Attempting neuron graph capture of step() for an instance of {type(optimizer).__name__} but "
                "param_groups' capturable is False: a replay would reuse the step count and bias corrections "
                "of the capture. Build the optimizer with capturable=True (torchneuron.capture does it for the "
                "optimizers its warm-up calls step).")
        watched = getattr(_state, "watched", None)
        if watched is not None and all(o is not optimizer for o, _ in watched):
            watched.append((optimizer, _host_values(optimizer)))  # what this step reads
    elif getattr(_state, "warming", False):
        make_capturable(optimizer)


# Optimizers whose capturable step takes a tensor learning rate (torch.optim's documentation).
TENSOR_LEARNING_RATE = (torch.optim.Adam, torch.optim.AdamW)


def make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Set `capturable=True` where the optimizer offers it, moving its step counts to its
    parameters' device (what the optimizer would have made had it been built capturable), and,
    where its step takes one, its learning rate into a device tensor that schedulers fill in place."""
    for group in optimizer.param_groups:
        if group.get("capturable", True) or group.get("fused"):
            continue
        params = [p for p in group["params"] if p.device.type == "neuron"]
        if not params:
            continue
        group["capturable"] = True
        for p in params:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor) and step.device != p.device:
                optimizer.state[p]["step"] = step.to(p.device)
        if isinstance(optimizer, TENSOR_LEARNING_RATE) and not isinstance(group["lr"], torch.Tensor):
            group["lr"] = torch.tensor(group["lr"], device=params[0].device)


class warming_up:
    """`with warming_up():` the optimizers stepped inside become capturable (torchneuron.capture)."""

    def __enter__(self):
        _state.warming = True

    def __exit__(self, *exc):
        _state.warming = False
        return False


def _calling(module: torch.nn.Module, args) -> None:
    modules = getattr(_state, "modules", None)
    if modules is not None and id(module) not in modules:
        modules[id(module)] = (module, module.training)


def watch() -> None:
    """Note the optimizers stepped and the modules called from now until `watched()` (a recording in
    progress; the global module hook lives only that long, as it slows every module call)."""
    _state.watched, _state.modules = [], {}
    _state.hook = torch.nn.modules.module.register_module_forward_pre_hook(_calling)


def watched() -> HostValues:
    """The host values the optimizers stepped since `watch()` read at their steps, and the training
    modes of the modules called."""
    hook = getattr(_state, "hook", None)
    if hook is not None:
        hook.remove()
    stepped, modules = getattr(_state, "watched", None) or [], getattr(_state, "modules", None) or {}
    _state.watched = _state.modules = _state.hook = None
    return HostValues(stepped, list(modules.values()))


def _host_values(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Each param group's settings that live on the host (numbers, CPU tensors), by name."""
    groups = []
    for group in optimizer.param_groups:
        values = {}
        for name, value in group.items():
            if name == "params":
                continue
            if isinstance(value, torch.Tensor):
                if value.device.type != "cpu":
                    continue  # read afresh at each replay
                value = value.tolist()
            values[name] = value
        groups.append(values)
    return groups


class HostValues:
    """What a recording's optimizers held on the host when it was made."""

    def __init__(self, stepped: list, modules: list):
        self.optimizers = [optimizer for optimizer, _ in stepped]
        self.values = [values for _, values in stepped]
        self.modules = modules  # (module, its training mode in the recording)

    def changed(self) -> str | None:
        """None, or which value changed since the recording, from what to what."""
        for module, training in self.modules:
            if module.training != training:
                return f"the training mode of {type(module).__name__} changed from {training} to {module.training}"
        for optimizer, before in zip(self.optimizers, self.values):
            now = _host_values(optimizer)
            if now == before:
                continue
            for index, (old, new) in enumerate(zip(before, now)):
                for name in old.keys() | new.keys():
                    if old.get(name) != new.get(name):
                        return (f"param_groups[{index}][{name!r}] of {type(optimizer).__name__} changed from "
                                f"{old.get(name)!r} to {new.get(name)!r}")
            return f"the param_groups of {type(optimizer).__name__} changed"
        return None


def install() -> None:
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(_stepping)
