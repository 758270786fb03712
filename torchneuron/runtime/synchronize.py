"""Waiting for device work, and the safe points where queued frees are applied."""
from __future__ import annotations

import jax

from . import device_asserts, devices, storages
from .core import SyncCallback, lib


def drain() -> None:
    storages.drain()


def synchronize(device: int | None = None, raise_asserts: bool = True) -> None:
    """Block until every buffer of `device` (all devices if None) is computed, then raise the first
    device-side assert failure since the last synchronisation."""
    storages.drain()
    if devices.ASYNCHRONOUS:  # (inline XLA:CPU finished every call's work before the call returned)
        wanted = None if device is None else devices.jax_device(device)
        # Only storages written since the last synchronize can hold work not done (a buffer never
        # changes), and one call waits for them all (a Python loop took 0.5 µs a buffer). Results
        # whose tensors already died come last; a later in-place op may have donated some of them.
        jax.block_until_ready([*storages.take_unsynced(wanted), *storages.take_recent_outputs()])
    else:
        storages.take_unsynced()  # (fused eager's pending segment still runs)
    if raise_asserts:
        device_asserts.raise_failures()


def _on_sync(device: int) -> None:
    # From C++ (a stream or event wait): an exception cannot cross back, so failures stay
    # pending for the next synchronisation from Python.
    synchronize(device if device >= 0 else None, raise_asserts=False)


# Kept alive for as long as the C++ core may call it.
_callback = SyncCallback(_on_sync)


def install() -> None:
    lib.tn_set_sync_callback(_callback)
