"""Every counter torchneuron keeps, by area, in one table: `torchneuron.stats()` reads them all.

Each area's function (`eager_stats`, `compile_stats`, `cache_stats`, `fallback_stats`, ...) is the view
of one entry, so `torchneuron.stats()["cache"] == torchneuron.cache_stats()`.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .distributed import in_flight
from .eager.fallback import fallback_stats
from .eager.modes import eager_stats
from .runtime import capture, devices
from .runtime.executables import cache_stats


def compile_stats() -> dict:
    """torchneuron.compile.compile_stats (imported here only when asked: importing torchneuron leaves the
    compile backend unloaded until torch.compile first needs it)."""
    from .compile import compile_stats

    return compile_stats()


def memory_stats() -> dict[str, dict]:
    """`torch.neuron.memory_stats` of every NeuronCore, by device name."""
    return {f"neuron:{i}": torch.neuron.memory_stats(i) for i in range(devices.count())}


AREAS: dict[str, Callable[[], dict]] = {
    "eager": eager_stats,  # fused eager's segments and flushes, eager buckets, eager plans built/loaded
    "compile": compile_stats,  # torch.compile graphs, compiles, cache hits, recompile reasons
    "cache": cache_stats,  # the executable cache, prefetch, the plan/program/segment tables, host trims
    "fallback": fallback_stats,  # ops run on CPU, by op
    "capture": capture.stats,  # graphs captured and replayed
    "collectives": in_flight.stats,  # issued collectives and the seconds they took and were waited on
    "memory": memory_stats,  # per NeuronCore: allocated, reserved, peaks
}


def stats() -> dict[str, dict]:
    """Every counter, by area: {"eager": ..., "compile": ..., "cache": ..., "fallback": ...,
    "capture": ..., "collectives": ..., "memory": ...}; each area as its own function returns it.

        >>> torchneuron.stats()["fallback"] == torchneuron.fallback_stats()
        True
    """
    return {area: report() for area, report in AREAS.items()}
