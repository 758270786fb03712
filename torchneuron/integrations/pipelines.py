"""transformers' pipelines run on neuron when the caller names no device, as they run on cuda:0.

`Pipeline.__init__` turns `device=None` (and a bare ordinal, `device=0`) into the first accelerator
on its own list (mlu, musa, cuda, npu, hpu, xpu, mps) and else CPU, so with neuron the only
accelerator a pipeline ran on CPU, and moved a model already on neuron back to CPU. Where neuron is
the process's accelerator we hand it `neuron:<ordinal>` instead; an explicit device (`"cpu"`, -1,
a `torch.device`) and accelerate's `device_map` placement are left as they are.
"""
from __future__ import annotations

import functools
import inspect

import torch


def _neuron_is_the_accelerator() -> bool:
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    return accelerator is not None and accelerator.type == "neuron"


def on_pipelines_base(module) -> None:
    """Wrap `Pipeline.__init__` of transformers.pipelines.base once that module has run."""
    pipeline = module.Pipeline
    init = pipeline.__init__
    if hasattr(init, "torchneuron_wraps"):
        return
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        device = bound.arguments.get("device")
        model = bound.arguments.get("model")
        ordinal = device is None or (type(device) is int and device >= 0)
        if ordinal and getattr(model, "hf_device_map", None) is None and _neuron_is_the_accelerator():
            bound.arguments["device"] = torch.device("neuron", device or 0)
        init(*bound.args, **bound.kwargs)

    __init__.torchneuron_wraps = init
    pipeline.__init__ = __init__
