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
    wanted = None if device is None else devices.jax_device(device)
    for buf in storages.live_buffers():
        if wanted is None or wanted in buf.devices():
            buf.block_until_ready()
    # Results whose tensors already died; a later in-place op may have donated some of them.
    jax.block_until_ready(storages.recent_outputs())
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
