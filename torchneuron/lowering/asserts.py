"""Device-side asserts: conditions a lowering checks on the device, such as index bounds.

A lowering registered with `checks=True` calls `check_index(index, size, what)` (or
`device_assert(ok, message)`) while it is traced. The driver tracing it collects the checks of the
whole executable (`collecting()`) and threads the device's failure word through it
(`updated_failure`): 0 while every check has held, else the id of the first failed check's
message. The runtime reads the word at the next synchronisation (runtime/device_asserts.py), as
CUDA reports its device-side asserts.
"""
from __future__ import annotations

import contextlib
import threading

import jax.numpy as jnp

from ..runtime import assert_messages

_active = threading.local()


def device_assert(ok, message: str) -> None:
    """Record that boolean array `ok` must hold everywhere; `message` says what failed. Only inside
    a driver that collects checks (a lowering registered with checks=True, device asserts on)."""
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
def collecting(enabled: bool = True):
    """Collect the checks of the lowerings traced inside (a list of (ok, message)); with `enabled`
    False, checks are dropped."""
    outer = getattr(_active, "checks", None)
    checks: list = []
    _active.checks = checks if enabled else None
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


def updated_failure(failure, checks):
    """The failure word after these checks: unchanged if it already holds a failure or every check
    holds, else the message id of the first failing check (an int32 scalar)."""
    code = jnp.zeros((), jnp.int32)
    for ok, message in reversed(checks):
        code = jnp.where(ok, code, jnp.int32(assert_messages.message_id(message)))
    return jnp.where(failure != 0, failure, code)
