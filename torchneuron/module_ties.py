"""Keep shared parameters shared when a module moves to neuron.

`nn.Module.to(device)` keeps a Parameter object (and so weight tying) only when
`torch._has_compatible_shallow_copy_type` accepts the old and new tensors; in torch 2.13 that
list of "dense" backends omits PrivateUse1, so every parameter is replaced by a new one and a
tied embedding/head pair becomes two parameters. This wrapper records which modules share a
Parameter (or buffer) before the top-level `_apply` and restores the sharing afterwards.
"""
from __future__ import annotations

import threading

from torch import nn

_original_apply = nn.Module._apply
_state = threading.local()


def _shared_slots(root: nn.Module, attribute: str) -> list[list[tuple[nn.Module, str]]]:
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in root.modules():
        for name, value in getattr(module, attribute).items():
            if value is not None:
                places.setdefault(id(value), []).append((module, name))
    return [p for p in places.values() if len(p) > 1]


def _apply_keeping_ties(self: nn.Module, fn, recurse: bool = True):
    if getattr(_state, "active", False) or not recurse:
        return _original_apply(self, fn, recurse)
    shared = {attr: _shared_slots(self, attr) for attr in ("_parameters", "_buffers")}
    _state.active = True
    try:
        result = _original_apply(self, fn, recurse)
    finally:
        _state.active = False
    for attr, groups in shared.items():
        for (first_module, first_name), *others in groups:
            value = getattr(first_module, attr)[first_name]
            for module, name in others:
                getattr(module, attr)[name] = value
    return result


def install() -> None:
    nn.Module._apply = _apply_keeping_ties
