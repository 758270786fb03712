"""The messages of device-side asserts, by the id a failure word holds (runtime/device_asserts.py).

An id is a hash of its message, the same in every process: a program that checks compiles to the
same code wherever it is traced, so it is stored and loaded by name like any other, and the
messages it can raise travel with it (`collected` while it is traced, `register` when it is loaded).
"""
from __future__ import annotations

import contextlib
import hashlib
import threading

_messages: dict[int, str] = {}  # message id -> message
_ids: dict[str, int] = {}
_collecting = threading.local()  # the sets of ids that traces running on this thread collect


def message_id(message: str) -> int:
    """The id a failure word holds for `message` (at trace time)."""
    found = _ids.get(message)
    if found is None:
        digest = hashlib.sha256(message.encode()).digest()
        found = _ids[message] = int.from_bytes(digest[:4], "little") % (2**31 - 1) + 1  # (a positive int32)
        known = _messages.get(found)
        _messages[found] = message if known is None or known == message else f"{known} (or: {message})"
    for ids in getattr(_collecting, "sets", ()):
        ids.add(found)
    return found


@contextlib.contextmanager
def collected():
    """The ids of the messages traced inside, as a set (stored with a program: a process that
    loads it untraced registers them)."""
    ids: set = set()
    outer = getattr(_collecting, "sets", ())
    _collecting.sets = (*outer, ids)
    try:
        yield ids
    finally:
        _collecting.sets = outer


def messages_of(ids) -> dict:
    """id -> message, for ids of this process's messages."""
    return {i: _messages[i] for i in ids}


def register(messages: dict) -> None:
    """Messages of a program loaded untraced (id -> message)."""
    for i, message in messages.items():
        if _messages.setdefault(i, message) == message:
            _ids[message] = i


def text(message_id: int) -> str:
    """The message of `message_id` (a failure word's value)."""
    return _messages.get(message_id, f"check {message_id}")
