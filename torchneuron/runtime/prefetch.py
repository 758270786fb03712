"""Warm starts: the programs a process will load from the persistent cache, loaded ahead of it.

A second run of a program asks the cache for the same programs in about the same order as the
first, and each load (deserialising an XLA executable: ~2 ms for one op, ~40 ms for a fused
segment) used to stop the calling thread. So every process notes the order in which it loaded or
stored named programs, and at exit stores, beside every eighth program, the names of the
`config.CACHE_PREFETCH` programs that followed it (only where that list changed; one list per
program doubled the files a test suite leaves in the cache). When a later process loads a program,
a worker thread loads the ones that followed it last time while the calling thread goes on (XLA
deserialises without the GIL: the calling thread keeps about three quarters of its speed on two
cores); asked for one, the calling thread takes it from the worker, or waits for the one the
worker is loading, or loads it itself. At most HOLD loaded programs wait to be asked for; a
prediction that fails costs worker time only, never a result. `TORCHNEURON_CACHE_PREFETCH` sets
`config.CACHE_PREFETCH` (0: off); `torchneuron.cache_stats()` counts `prefetched` and `prefetch_hits`.
"""
from __future__ import annotations

import atexit
import collections
import functools
import hashlib
import os
import threading

import jax

from .. import config
from . import compilation_cache
from .background import BackgroundQueue, stopping

HOLD = 64  # loaded programs not asked for yet (the oldest goes first)
MAX_NOTED = 4096  # programs a process notes: a warm start is its first ones

_cond = threading.Condition()
# key -> (device id, loaded, whether a list of its followers was stored beside it)
_ready: collections.OrderedDict = collections.OrderedDict()
_loading = [None]  # the key the worker is loading now
_asked: set = set()  # keys this process loaded or stored itself: never loaded ahead
_order: list = []  # [key, device id] in the order this process asked for them
_known: dict = {}  # key -> the successors the store held for it (read by the worker)
STATS = collections.Counter()  # prefetched, prefetch_hits
_WORKER = BackgroundQueue("torchneuron-prefetch")


def load(key: str, args, device=None):
    """`compilation_cache.load`, served from what the worker loaded ahead when it holds it: the
    loaded program, or None; the second value says whether it came from the worker."""
    target = compilation_cache.target_of(args, device)
    taken = _take(key, target)
    if taken is None:
        loaded = compilation_cache.load_onto(key, target)
        if loaded is not None:
            noted(key, target)
        return loaded, False
    loaded, anchored = taken
    # the worker reads on from the next program with a list, half way through this one (reading
    # every program's names, mostly the same ones shifted by one, cost the calling thread more than
    # it saved)
    noted(key, target, follow=anchored)
    return loaded, True


def noted(key: str, target, follow: bool = True) -> None:
    """This process asked for (loaded or stored) the program `key` on device `target`; `follow`:
    the worker loads the programs that followed it."""
    if not config.CACHE_PREFETCH or target is None or compilation_cache.directory() is None:
        return
    with _cond:
        if key in _asked or len(_order) >= MAX_NOTED:
            return
        _asked.add(key)
        _order.append([key, target.id])
    if follow:
        _WORKER.submit(functools.partial(_load_after, key))


def replaced(old: str, new: str) -> None:
    """A program noted as `old` was replaced by `new` (promoted to full optimisation and stored):
    later processes load `new` in its place."""
    with _cond:
        _asked.add(new)
        for entry in _order:
            if entry[0] == old:
                entry[0] = new


def stats() -> dict:
    return {"prefetched": STATS["prefetched"], "prefetch_hits": STATS["prefetch_hits"]}


def _take(key: str, target):
    if not config.CACHE_PREFETCH or target is None:
        return None
    with _cond:
        while _loading[0] == key:  # (sooner than loading it a second time)
            _cond.wait()
        entry = _ready.pop(key, None)
        if entry is None or entry[0] != target.id:
            return None
        STATS["prefetch_hits"] += 1
    return entry[1], entry[2]


def _successors_key(key: str) -> str:
    # (the list's format and length are in its name: a list of another format is never read)
    return key + _successors_suffix(config.CACHE_PREFETCH)


@functools.cache
def _successors_suffix(look_ahead: int) -> str:
    return "-next-" + hashlib.sha256(repr(("successors", 2, look_ahead)).encode()).hexdigest()[:8]


def _load_after(key: str) -> None:
    """(The worker's job) load the programs that followed `key` in the process before."""
    successors = compilation_cache.load_value(_successors_key(key)) or []
    devices = {d.id: d for d in jax.devices()}
    with _cond:
        _known[key] = successors
    for successor, device_id, anchored in successors:
        if stopping():
            return
        with _cond:
            if successor in _asked or successor in _ready or device_id not in devices:
                continue
            _loading[0] = successor
        loaded = None
        try:
            loaded = compilation_cache.load_onto(successor, devices[device_id])
        finally:
            with _cond:
                _loading[0] = None
                if loaded is not None and successor not in _asked:
                    _ready[successor] = (device_id, loaded, anchored)
                    STATS["prefetched"] += 1
                    while len(_ready) > HOLD:
                        _ready.popitem(last=False)
                _cond.notify_all()


def _forked() -> None:
    """A forked child starts with none of the parent's worker state (its lock may be held, and
    programs loaded for the parent's devices are not the child's)."""
    global _cond
    _cond = threading.Condition()
    _loading[0] = None
    _ready.clear()
    _order.clear()
    _asked.clear()


os.register_at_fork(after_in_child=_forked)


@atexit.register
def _store_successors() -> None:
    """Beside each program this process asked for, the ones that followed it (where they changed)."""
    if not config.CACHE_PREFETCH:
        return
    look_ahead = config.CACHE_PREFETCH
    anchor_every = max(look_ahead // 2, 1)  # programs with a list of their followers: every this many
    with _cond:
        order = [tuple(entry) for entry in _order]
        known = dict(_known)
    for i, (key, _) in enumerate(order):
        successors = [[name, device_id, j % anchor_every == 0]
                      for j, (name, device_id) in enumerate(order[i + 1:i + 1 + look_ahead], start=i + 1)]
        if i % anchor_every or not successors:
            continue
        stored = known[key] if key in known else compilation_cache.load_value(_successors_key(key))
        if stored != successors:  # (a read is cheaper than a write: most lists are as they were)
            compilation_cache.store_value(_successors_key(key), successors)
