"""Hugging Face accelerate and transformers pick neuron by themselves (see docs/HUGGINGFACE.md).

Both libraries already know a device "neuron" (accelerate: `DistributedType.MULTI_NEURON`,
`torch.neuron.*` seeds and RNG states; transformers: `torch.neuron.set_device`, compile backend
"neuron") but decide it exists through one availability probe each, which looks for AWS's
`torch_neuronx` package. We wrap that probe so it also answers yes when `torch.neuron` has devices.

The probe is imported by name into many of their modules, so it is wrapped the moment its own module
has run, before anything can bind the original: a meta path finder watches for the two module names
and nothing else, so importing torchneuron imports neither library. If a library renames its probe,
nothing is wrapped and it keeps its old behaviour (CPU).
"""
from __future__ import annotations

import functools
import importlib.abc
import sys
from collections.abc import Callable

import torch

# Module that defines the probe -> the probe's name.
PROBES = {
    "accelerate.utils.imports": "is_neuron_available",
    "transformers.utils.import_utils": "is_torch_neuron_available",
}


def _with_neuron(probe: Callable[..., bool]) -> Callable[..., bool]:
    """`probe`, answering yes also when torch.neuron (this package) has devices."""

    @functools.lru_cache
    @functools.wraps(probe)  # keeps transformers' marker that lets torch.compile inline the answer
    def available(*args, **kwargs) -> bool:
        return probe(*args, **kwargs) or torch.neuron.is_available()

    available.torchneuron_wraps = probe
    return available


def _wrap_probe(module) -> None:
    name = PROBES[module.__name__]
    probe = getattr(module, name, None)
    if probe is None or hasattr(probe, "torchneuron_wraps"):
        return
    wrapped = _with_neuron(probe)
    setattr(module, name, wrapped)
    # Modules loaded before us (autoload off, library imported first) bound the original by name.
    for other in list(sys.modules.values()):
        if getattr(other, name, None) is probe:
            setattr(other, name, wrapped)


class _ProbeWrapper(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the modules in ON_IMPORT it wraps the real loader's exec_module."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in ON_IMPORT:
            return None
        finders = (finder for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec"))
        spec = next((spec for finder in finders if (spec := finder.find_spec(fullname, path, target))), None)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            ON_IMPORT[fullname](module)

        spec.loader.exec_module = exec_module  # this file's own loader instance only
        return spec


# Modules whose import we watch -> what to do once each has run.
ON_IMPORT = {name: _wrap_probe for name in PROBES}


def when_imported(module_name: str, action: Callable) -> None:
    """Call `action(module)` once module `module_name` of these libraries has run (now if it has):
    the package wires other layers' hooks here (lowerings of the libraries' custom ops)."""
    ON_IMPORT[module_name] = action
    if module_name in sys.modules:
        action(sys.modules[module_name])


def install() -> None:
    """Wrap the probes of the libraries already loaded, and of those loaded later."""
    for name, action in ON_IMPORT.items():
        if name in sys.modules:
            action(sys.modules[name])
    if not any(isinstance(finder, _ProbeWrapper) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ProbeWrapper())
