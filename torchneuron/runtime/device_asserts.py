"""Device-side assert failures, reported at the next synchronisation (as CUDA reports its own).

A call whose executable checks conditions (index bounds) hands its failure code here with the
checks' messages. Codes are read when the host next waits for the device (synchronize, a copy
to the host, `.item()`), or at once with TORCHNEURON_LAUNCH_BLOCKING=1 (as CUDA_LAUNCH_BLOCKING),
so a failure names the op whatever the host did in between.
"""
from __future__ import annotations

import threading

import jax

from .. import config


class DeviceAssertError(RuntimeError):
    """A condition checked on a NeuronCore failed (an index out of bounds, say)."""


_pending: list = []  # (failure code, the checks' messages) of calls not yet read
_lock = threading.Lock()
# Codes are read once this many wait, those already computed only: a bound on the list that never
# waits for the device.
_READ_READY_AT = 256


def record(code: jax.Array, messages: tuple[str, ...]) -> None:
    """A call's failure code (0: every check held; k: messages[k - 1] failed)."""
    with _lock:
        _pending.append((code, messages))
        full = len(_pending) >= _READ_READY_AT
    if config.LAUNCH_BLOCKING:
        raise_failures()
    elif full:
        raise_failures(ready_only=True)


def raise_failures(ready_only: bool = False) -> None:
    """Read the pending codes (waiting for them, unless `ready_only`) and raise the first failure."""
    if not _pending:
        return
    with _lock:
        taken = [p for p in _pending if not ready_only or p[0].is_ready()]
        kept = [p for p in _pending if ready_only and not p[0].is_ready()]
        _pending[:] = kept
    for code, (_, messages) in zip(jax.device_get([c for c, _ in taken]), taken):
        if code:
            with _lock:
                _pending.clear()  # reported once, as the first failure since the last read
            hint = "" if config.LAUNCH_BLOCKING else " (TORCHNEURON_LAUNCH_BLOCKING=1 raises at the op itself)"
            raise DeviceAssertError(f"neuron: device-side assert triggered: {messages[int(code) - 1]}{hint}")
