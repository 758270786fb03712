"""`torch.neuron`: the device module, declared in one table (API) so it is easy to audit."""
from __future__ import annotations

import contextlib
import dataclasses
import types
import warnings

import torch

from .runtime import devices, generators
from .runtime import synchronize as _sync

_initialized = False


def is_available() -> bool:
    return devices.count() > 0


def device_count() -> int:
    return devices.count()


def is_initialized() -> bool:
    return _initialized


def _lazy_init() -> None:
    global _initialized
    _initialized = True


def _is_in_bad_fork() -> bool:
    return False


def current_device() -> int:
    return torch._C._accelerator_hooks_get_current_device()


def set_device(device) -> None:
    index = _index(device)
    if index >= 0:
        torch._C._accelerator_hooks_set_current_device(index)


def _index(device) -> int:
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if device is None:
        return current_device()
    return device.index if device.index is not None else current_device()


@contextlib.contextmanager
def device(device):
    """Context manager that makes `device` the current NeuronCore."""
    index = _index(device)
    previous = torch._C._accelerator_hooks_exchange_device(index)
    try:
        yield
    finally:
        torch._C._accelerator_hooks_set_current_device(previous)


def synchronize(device=None) -> None:
    """Wait for all work queued on a NeuronCore (all of them if device is None)."""
    _sync.synchronize(None if device is None else _index(device))


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """A NeuronCore as `get_device_properties` describes it; the fields CUDA's have under the same names."""
    name: str  # the PJRT device kind
    total_memory: int  # bytes


def get_device_properties(device=None) -> DeviceProperties:
    """What the NeuronCore is; trainers read `.name` for their logs (TRL's telemetry does on neuron).

    >>> torch.neuron.get_device_properties(0).total_memory > 0
    True
    """
    index = _index(device)
    _, total = torch.accelerator.get_memory_info(torch.device("neuron", index))
    return DeviceProperties(name=devices.jax_device(index).device_kind, total_memory=total)


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


# ------------------------------------------------------------------ RNG
def manual_seed(seed: int) -> None:
    generators.default_generator(current_device()).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        generators.default_generator(i).manual_seed(int(seed))


def seed() -> None:
    generators.default_generator(current_device()).seed()


def seed_all() -> None:
    for i in range(device_count()):
        generators.default_generator(i).seed()


def initial_seed() -> int:
    return generators.default_generator(current_device()).initial_seed()


def get_rng_state(device="neuron") -> torch.Tensor:
    return generators.default_generator(_index(device)).get_state()


def set_rng_state(new_state: torch.Tensor, device="neuron") -> None:
    generators.default_generator(_index(device)).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states) -> None:
    for i, s in enumerate(states):
        set_rng_state(s, i)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 is native on NeuronCores and lowered by XLA on every backend; transformers asks
    before `TrainingArguments(bf16=True)`."""
    return True


# -------------------------------------------------------------- streams
class Stream(torch.Stream):
    """A neuron stream. Work runs in issue order on each NeuronCore, so streams order work
    the way CUDA streams do when every stream waits on the one before."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        index = _index(device)
        return super().__new__(cls, device=torch.device("neuron", index), priority=priority, **kwargs)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
    """A neuron event (a torch.Event: PyTorch's event methods accept only that exact type)."""
    return torch.Event(device=torch.device("neuron", current_device()), enable_timing=enable_timing,
                       blocking=blocking, interprocess=interprocess)


def current_stream(device=None) -> torch.Stream:
    return torch.accelerator.current_stream(torch.device("neuron", _index(device)))


@contextlib.contextmanager
def stream(s):
    """Make `s` the current stream of its device inside the block."""
    if s is None:
        yield
        return
    previous = torch.accelerator.current_stream(s.device)
    torch.accelerator.set_stream(s)
    try:
        yield
    finally:
        torch.accelerator.set_stream(previous)


# --------------------------------------------------------------- memory
def memory_allocated(device=None) -> int:
    _sync.drain()
    return torch.accelerator.memory_allocated(torch.device("neuron", _index(device)))


def max_memory_allocated(device=None) -> int:
    return torch.accelerator.max_memory_allocated(torch.device("neuron", _index(device)))


def memory_reserved(device=None) -> int:
    _sync.drain()
    return torch.accelerator.memory_reserved(torch.device("neuron", _index(device)))


def max_memory_reserved(device=None) -> int:
    return torch.accelerator.max_memory_reserved(torch.device("neuron", _index(device)))


def memory_stats(device=None) -> dict:
    _sync.drain()
    return torch.accelerator.memory_stats(torch.device("neuron", _index(device)))


def reset_peak_memory_stats(device=None) -> None:
    torch.accelerator.reset_peak_memory_stats(torch.device("neuron", _index(device)))


def reset_accumulated_memory_stats(device=None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(torch.device("neuron", _index(device)))


def reset_max_memory_allocated(device=None) -> None:
    """Deprecated in torch.cuda as here: resets every peak (`reset_peak_memory_stats`)."""
    warnings.warn("torch.neuron.reset_max_memory_allocated now calls torch.neuron.reset_peak_memory_stats, "
                  "which resets all peak memory stats.", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device=None) -> None:
    """Deprecated in torch.cuda as here: resets every peak (`reset_peak_memory_stats`)."""
    warnings.warn("torch.neuron.reset_max_memory_cached now calls torch.neuron.reset_peak_memory_stats, "
                  "which resets all peak memory stats.", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def memory_cached(device=None) -> int:
    """Deprecated in torch.cuda as here: `memory_reserved`."""
    warnings.warn("torch.neuron.memory_cached has been renamed to torch.neuron.memory_reserved", FutureWarning,
                  stacklevel=2)
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    """Deprecated in torch.cuda as here: `max_memory_reserved`."""
    warnings.warn("torch.neuron.max_memory_cached has been renamed to torch.neuron.max_memory_reserved",
                  FutureWarning, stacklevel=2)
    return max_memory_reserved(device)


def memory_stats_as_nested_dict(device=None) -> dict:
    """`memory_stats` with its dotted names as nested dictionaries (torch.cuda's form)."""
    nested: dict = {}
    for name, value in memory_stats(device).items():
        *path, last = name.split(".")
        place = nested
        for part in path:
            place = place.setdefault(part, {})
        place[last] = value
    return nested


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A table of the allocator's statistics: current, peak, allocated and freed, in bytes and counts."""
    stats = memory_stats(device)
    rows = [("Allocated memory", "allocated_bytes"), ("Active memory", "active_bytes"),
            ("Requested memory", "requested_bytes"), ("Reserved memory", "reserved_bytes"),
            ("Allocations", "allocation"), ("Active allocs", "active")]
    pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
    lines = [f"neuron:{_index(device)} memory summary",
             f"{'metric':<34}{'current':>14}{'peak':>14}{'allocated':>14}{'freed':>14}"]
    for label, key in rows:
        for pool in pools:
            values = [stats.get(f"{key}.{pool}.{kind}", 0) for kind in ("current", "peak", "allocated", "freed")]
            name = label if pool == "all" else f"  from {pool.replace('_', ' ')}"
            lines.append(f"{name:<34}" + "".join(f"{v:>14}" for v in values))
    lines.append(f"{'OOMs':<34}{stats.get('num_ooms', 0):>14}")
    return "\n".join(lines) + "\n"


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Cap what this process may allocate on the device at `fraction` of its capacity; beyond it an
    allocation raises `torch.OutOfMemoryError` (torch.cuda's rule; the cap is also what
    `mem_get_info` and `get_device_properties` report as total)."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    index = _index(device)
    _fractions[index] = fraction
    _core().tn_set_memory_limit(index, int(fraction * devices.default_memory_limit(index)))


def get_per_process_memory_fraction(device=None) -> float:
    return _fractions.get(_index(device), 1.0)


_fractions: dict[int, float] = {}


def _core():
    from .runtime.core import lib
    return lib


def empty_cache() -> None:
    _sync.drain()


def mem_get_info(device=None) -> tuple[int, int]:
    return torch.accelerator.get_memory_info(torch.device("neuron", _index(device)))


# The public surface, in one place: name -> stability.
API = {
    "is_available": "stable", "device_count": "stable", "current_device": "stable", "set_device": "stable",
    "device": "stable", "is_initialized": "stable", "_is_in_bad_fork": "internal",
    "_lazy_init": "internal", "synchronize": "stable",
    "DeviceProperties": "stable", "get_device_properties": "stable", "get_device_name": "stable",
    "manual_seed": "stable", "manual_seed_all": "stable", "seed": "stable", "seed_all": "stable",
    "initial_seed": "stable", "get_rng_state": "stable", "set_rng_state": "stable",
    "get_rng_state_all": "stable", "set_rng_state_all": "stable",
    "get_amp_supported_dtype": "stable", "is_bf16_supported": "stable",
    "Stream": "stable", "Event": "stable", "current_stream": "stable",
    "stream": "stable",
    "memory_allocated": "stable", "max_memory_allocated": "stable", "memory_reserved": "stable",
    "max_memory_reserved": "stable", "memory_stats": "stable", "reset_peak_memory_stats": "stable",
    "empty_cache": "stable", "mem_get_info": "stable", "reset_accumulated_memory_stats": "stable",
    "memory_stats_as_nested_dict": "stable", "memory_summary": "stable",
    "set_per_process_memory_fraction": "stable", "get_per_process_memory_fraction": "stable",
    "reset_max_memory_allocated": "deprecated", "reset_max_memory_cached": "deprecated",
    "memory_cached": "deprecated", "max_memory_cached": "deprecated",
}


def build() -> types.ModuleType:
    module = types.ModuleType("torch.neuron", "The neuron device module (torchneuron).")
    for name in API:
        setattr(module, name, globals()[name])
    module.API = API
    # Registering initialises the device; torch.utils.checkpoint saves and replays the device's
    # RNG state only when the device module's `_initialized` is true.
    _lazy_init()
    module._initialized = True
    return module
