"""Device-side asserts: conditions a lowering checks on the device, such as index bounds.

A lowering calls `check_index(index, size, what)` (or `device_assert(ok, message)`) while it is
traced. The driver tracing it collects the checks of the whole executable (`collecting()`) and
returns one more output, `failure_code(checks)`: 0 when every check held, else 1 + the number of
the first that failed. The runtime reports a failure at the next synchronisation at the latest
(runtime/device_asserts.py), as CUDA reports its device-side asserts.
"""
from __future__ import annotations

import contextlib
import threading

import jax.numpy as jnp

from .. import config

_active = threading.local()


def device_assert(ok, message: str) -> None:
    """Record that boolean array `ok` must hold everywhere; `message` says what failed. Outside a
    collecting driver (or with TORCHNEURON_DEVICE_ASSERTS=0) it does nothing."""
    checks = getattr(_active, "checks", None)
    if checks is not None:
        checks.append((jnp.all(ok), f"{getattr(_active, 'op', None) or 'neuron op'}: {message}"))


def check_index(index, size: int, what: str = "index", negative: bool = False) -> None:
    """Every element of integer array `index` addresses one of `size` positions: in [0, size), or
    with `negative` in [-size, size) (counting from the end, as advanced indexing allows)."""
    if index.size and jnp.issubdtype(index.dtype, jnp.integer):
        low = -size if negative else 0
        device_assert((index >= low) & (index < size), f"{what} out of bounds for size {size}")


@contextlib.contextmanager
def collecting():
    """Collect the checks of the lowerings traced inside, as a list of (ok, message)."""
    outer = getattr(_active, "checks", None)
    checks: list = []
    _active.checks = checks if config.DEVICE_ASSERTS else None
    try:
        yield checks
    finally:
        _active.checks = outer


@contextlib.contextmanager
def op_scope(op):
    """Name `op` in the messages of the checks its lowering makes."""
    outer = getattr(_active, "op", None)
    _active.op = op
    try:
        yield
    finally:
        _active.op = outer


def failure_code(checks):
    """0 when every check holds, else 1 + the index of the first failing one (an int32 scalar)."""
    code = jnp.zeros((), jnp.int32)
    for i in reversed(range(len(checks))):
        code = jnp.where(checks[i][0], code, jnp.int32(i + 1))
    return code
