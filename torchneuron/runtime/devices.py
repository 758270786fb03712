"""NeuronCores are PJRT devices, reached through JAX.

JAX must be configured before its backend starts: 64-bit types on (or int64 and
float64 silently become 32-bit), full float32 matmul precision, and on the CPU
platform the number of virtual devices.
"""
from __future__ import annotations

import os

from .. import config

if config.PLATFORM == "cpu":
    flag = f"--xla_force_host_platform_device_count={config.CORES}"
    os.environ["XLA_FLAGS"] = " ".join(
        f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f
    ) + " " + flag

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_default_matmul_precision", "highest")
jax.config.update("jax_platforms", config.PLATFORM)
jax.config.update("jax_cpu_enable_async_dispatch", config.ASYNC_DISPATCH)
# Whether a call can return before its work is done: XLA:CPU runs inline unless told otherwise.
ASYNCHRONOUS = config.PLATFORM != "cpu" or config.ASYNC_DISPATCH
# Whether device buffers live in host memory (and may adopt host arrays handed to them).
HOST_MEMORY = config.PLATFORM == "cpu"


def _start_multi_process() -> bool:
    """With TORCHNEURON_XLA_COLLECTIVES=1 under a launcher (RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT set), join JAX's multi-process runtime before its backend starts, so XLA programs can
    hold collectives across the ranks (on cpu through gloo). Its coordinator listens on
    MASTER_PORT + 1 (TORCHNEURON_JAX_COORDINATOR overrides: host:port)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if not config.XLA_COLLECTIVES or world < 2 or "RANK" not in os.environ:
        return False
    if config.PLATFORM == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    coordinator = config.JAX_COORDINATOR or \
        f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{int(os.environ.get('MASTER_PORT', '29500')) + 1}"
    jax.distributed.initialize(coordinator, num_processes=world, process_id=int(os.environ["RANK"]))
    return True


# Whether this process is one rank of JAX's multi-process runtime (jax.devices() then lists every
# rank's devices; this rank's NeuronCores are its local ones).
MULTI_PROCESS = _start_multi_process()

_devices: list | None = None


def jax_devices() -> list:
    """The PJRT devices that are neuron:0, neuron:1, ..."""
    global _devices
    if _devices is None:
        found = jax.local_devices(backend=config.PLATFORM)
        _devices = found[: config.CORES] if config.PLATFORM == "cpu" else found
    return _devices


def jax_device(index: int):
    return jax_devices()[index]


def count() -> int:
    return len(jax_devices())


def default_memory_limit(index: int) -> int:
    """Device capacity: the limit set by TORCHNEURON_MEMORY_LIMIT, else what PJRT reports, else a
    share of host memory for the CPU platform."""
    if config.MEMORY_LIMIT:
        return int(config.MEMORY_LIMIT)
    stats = jax_device(index).memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return host // 2 // max(count(), 1)
