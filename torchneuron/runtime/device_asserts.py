"""Device-side assert failures, reported at the next synchronisation (as CUDA reports its own).

Each NeuronCore has a failure word, an int32 on the device: 0, or the id of the first failed
check's message. Executables that check conditions (index bounds) take the word and return it
updated, so checking costs no host work; the host reads the words when it next waits for the
device (synchronize, a copy to the host, `.item()`), or after every checking call with
TORCHNEURON_LAUNCH_BLOCKING=1 (as CUDA_LAUNCH_BLOCKING), and raises the failure naming the op.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import config
from . import assert_messages, deferred, devices


class DeviceAssertError(RuntimeError):
    """A condition checked on a NeuronCore failed (an index out of bounds, say)."""


_words: dict[int, jax.Array] = {}  # device index -> its failure word, once a checking call ran
_unread: set[int] = set()  # cores whose word changed since the host last read it


def word(device_index: int) -> jax.Array:
    """The failure word of a NeuronCore, to pass to a checking executable."""
    found = _words.get(device_index)
    if found is None:
        found = _words[device_index] = jax.device_put(np.zeros((), np.int32), devices.jax_device(device_index))
    return found


def words() -> dict:
    """device index -> its failure word (the cores that ran a checking call)."""
    return _words


def set_word(device_index: int, value) -> None:
    """Put back a word (a capture that ran nothing); None: the core's word as if never checked."""
    if value is None:
        _words.pop(device_index, None)
    else:
        _words[device_index] = value


def update(device_index: int, new_word: jax.Array) -> None:
    """The word a checking executable returned."""
    _words[device_index] = new_word
    _unread.add(device_index)
    if config.LAUNCH_BLOCKING:
        raise_failures()


def resolve_pending() -> None:
    """Failure words a flushed segment computed: the arrays themselves (deferred execution)."""
    for index, value in list(_words.items()):
        if type(value) is deferred.Pending and value.value is not None:
            _words[index] = value.value


def raise_failures() -> None:
    """Read the failure words that changed since the last read (waiting for their work) and raise
    the first failure; the word is cleared, so a failure is reported once. With no checking call
    since the last read, nothing is read from the device."""
    while _unread:
        index = _unread.pop()
        value = _words[index] = deferred.concrete(_words[index])
        code = int(np.asarray(value))
        if code:
            _words[index] = jnp.zeros_like(value)
            hint = "" if config.LAUNCH_BLOCKING else " (TORCHNEURON_LAUNCH_BLOCKING=1 raises at the op itself)"
            raise DeviceAssertError(f"neuron: device-side assert triggered: {assert_messages.text(code)}{hint}")


deferred.AFTER_FLUSH.append(resolve_pending)
