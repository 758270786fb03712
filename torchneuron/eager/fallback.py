"""The boxed PrivateUse1 fallback: every op without a kernel of its own lands here.

In order: a view op is answered by aliasing (its meta kernel gives the view's geometry);
an op with a PyTorch decomposition runs that decomposition on the device; anything else runs
on CPU, counted per op and warned once, or refused with TORCHNEURON_FALLBACK=error.
"""
from __future__ import annotations

import collections
import threading
import warnings

import torch
from torch._decomp import core_aten_decompositions
from torch.utils._pytree import tree_map

from .. import config
from .schema import parse

# Decompositions into Core ATen only: torch._refs entries end in prims that call back into aten.
DECOMPOSITIONS = core_aten_decompositions()
_active = threading.local()
STATS: collections.Counter = collections.Counter()
decomposed: collections.Counter = collections.Counter()


class FallbackError(NotImplementedError):
    pass


def fallback_stats() -> dict[str, int]:
    """How many times each op without a lowering ran on CPU."""
    return dict(STATS)


def dispatch(op, *args, **kwargs):
    schema = parse(op)
    if schema.view and not schema.mutates:
        return _alias_view(op, args, kwargs)
    decomposition = DECOMPOSITIONS.get(op)
    active = _active.__dict__.setdefault("ops", set())
    if decomposition is not None and op not in active:  # a decomposition that re-enters its op falls back
        decomposed[str(op)] += 1
        active.add(op)
        try:
            out = decomposition(*args, **kwargs)
        finally:
            active.discard(op)
        if out is not NotImplemented:
            return out
    return _run_on_cpu(op, schema, args, kwargs)


def _to_meta(x):
    if isinstance(x, torch.Tensor) and x.device.type == "neuron":
        m = torch.empty(0, dtype=x.dtype, device="meta")
        storage = torch.empty(x.untyped_storage().nbytes(), dtype=torch.uint8, device="meta").untyped_storage()
        return m.set_(storage, x.storage_offset(), x.shape, x.stride())
    return x


def _alias_view(op, args, kwargs):
    """A view op: same storage, the geometry its meta kernel computes."""
    source = next(a for a in args if isinstance(a, torch.Tensor))
    meta = op(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))

    def realise(m):
        if not isinstance(m, torch.Tensor):
            return m
        if m.dtype == source.dtype:
            return source.as_strided(m.shape, m.stride(), m.storage_offset())
        out = torch.empty(0, dtype=m.dtype, device=source.device)
        return out.set_(source.untyped_storage(), m.storage_offset(), m.shape, m.stride())

    return tree_map(realise, meta)


def _run_on_cpu(op, schema, args, kwargs):
    name = str(op)
    if config.FALLBACK == "error":
        raise FallbackError(
            f"neuron has no lowering for {name} and TORCHNEURON_FALLBACK=error forbids running it on CPU")
    if name not in STATS:
        warnings.warn(f"neuron: {name} has no lowering; running it on CPU (counted in "
                      f"torchneuron.fallback_stats())", stacklevel=3)
    STATS[name] += 1
    device = next((a.device for a in _tensors(args, kwargs) if a.device.type == "neuron"),
                  torch.device("neuron", torch.neuron.current_device()))
    originals = {}

    def to_cpu(x):
        if isinstance(x, torch.Tensor) and x.device.type == "neuron":
            c = x.cpu()
            originals[id(c)] = x
            return c
        if isinstance(x, torch.device) and x.type == "neuron":
            return torch.device("cpu")
        return x

    cpu_args = tree_map(to_cpu, args)
    cpu_kwargs = tree_map(to_cpu, kwargs)
    if "device" in cpu_kwargs and cpu_kwargs["device"] is not None:
        cpu_kwargs["device"] = torch.device("cpu")
    out = op(*cpu_args, **cpu_kwargs)
    for i in schema.written:  # write mutated arguments back
        name_i = schema.names[i]
        cpu_v = cpu_args[i] if i < len(cpu_args) else cpu_kwargs.get(name_i)
        for c in (cpu_v if isinstance(cpu_v, (list, tuple)) else [cpu_v]):
            if isinstance(c, torch.Tensor) and id(c) in originals:
                original = originals[id(c)]
                if original.shape != c.shape:  # an out= argument the op resized
                    original.resize_(c.shape)
                original.copy_(c)

    def back(x):
        if isinstance(x, torch.Tensor):
            if id(x) in originals:
                return originals[id(x)]
            return x.to(device)
        return x

    return tree_map(back, out)


def _tensors(args, kwargs):
    for x in list(args) + list(kwargs.values()):
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            yield from (y for y in x if isinstance(y, torch.Tensor))
