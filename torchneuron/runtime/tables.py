"""The module-level tables of plans, programs and segments, each bounded and counted.

Their entries are keyed by ops and shapes, so a program that meets endless new shapes (a data
loader's variable-length batches) would grow them without end. Most entries also go when the
executable cache evicts the program they hold (`executables.when_empty`); a `BoundedTable`
bounds the count as well, for entries that hold no executable (a view's plan, a refusal) or share
one that stays in use. Past its limit it forgets the entry added longest ago: one still in use is
built again at its next call (from its cached program: a rebuild, not a compile).

`torchneuron.cache_stats()["tables"]` reports every table's entries and limit.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

_REGISTERED: dict[str, tuple[Callable[[], int], int]] = {}  # name -> (its entry count, its limit)


def register(name: str, count: Callable[[], int], limit: int) -> None:
    """Report table `name` in cache_stats (`count()` its entries, at most `limit`)."""
    _REGISTERED[name] = (count, limit)


def report() -> dict:
    """name -> {"entries": ..., "limit": ...} for every registered table."""
    return {name: {"entries": count(), "limit": limit} for name, (count, limit) in _REGISTERED.items()}


class BoundedTable(dict):
    """A dict of at most `limit` entries. `add` inserts as the newest and forgets the oldest past
    the limit, calling `on_drop(key, value)` for each (to forget what it registered elsewhere).
    Lookups are a plain dict's (`get`, `[]`): the per-op paths pay nothing for the bound."""

    def __init__(self, name: str, limit: int, on_drop: Callable | None = None):
        super().__init__()
        self.limit = limit
        self.on_drop = on_drop
        self._adding = threading.Lock()  # (the autograd thread adds plans too)
        register(name, self.__len__, limit)

    def add(self, key, value) -> None:
        dropped = []
        with self._adding:
            self.pop(key, None)  # (re-added: the newest again)
            self[key] = value
            while len(self) > self.limit:
                old = next(iter(self))
                dropped.append((old, self.pop(old)))
        if self.on_drop is not None:
            for old, gone in dropped:
                self.on_drop(old, gone)

    def discard(self, key, value) -> None:
        """Forget `key` only while it still holds `value` (a callback of a dropped entry's program
        must not drop the entry built in its place)."""
        if self.get(key) is value:
            del self[key]
