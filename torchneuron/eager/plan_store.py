"""Plans kept across processes: what a plan learned from its op's meta kernel, stored by its key.

Building a plan runs the op's meta kernel on meta tensors, reads its results' layouts and names
the plan's program: about a third of a millisecond, and a warm-started `generate` builds some 300
plans (a gapped view of a growing batch, `ids[:, -1:]`, keys a new plan per length). What the
meta kernel told depends on the plan key alone, so it is stored under the key in the persistent
cache and read back by a later process: the fresh results' layouts and dtypes, integer results,
the compute dtype, the lowering's layout flags and the program's name. The rest of a plan
(argument slots, writes, groups) is rebuilt from the call, as every plan is.

A read is one small file; a warm process reads them from one bundle (compilation_cache's
bundle of small values).

Stored only for plans built without error or resize (a call that resizes its out= tensors runs
the meta kernel, and PyTorch's warning, every time), of torchneuron's own lowerings (a user's
kernel is not in the code version) and keys without per-process values; under the cache's
settings and code version, so an edited torchneuron never reads a stale plan. Off with the cache.
"""
from __future__ import annotations

from .. import config
from ..runtime import compilation_cache
from .describe import key_of

STATS = {"plans_built": 0, "plans_loaded": 0}


def key_for(schema, desc, lowering) -> str | None:
    """The stored key of the plan for this call, or None where it is not stored."""
    if lowering.user_code or lowering.data_dependent or compilation_cache.directory() is None:
        return None
    return compilation_cache.value_key("eager plan", repr((schema.name, key_of(schema, desc), config.DEVICE_ASSERTS)))


def _valid(record) -> bool:
    return type(record) is tuple and len(record) == 5  # (anything else: torn or foreign, built anew)


def load(key: str | None):
    """(fresh, int_results, compute_dtype, layout_flags, identity) stored under `key`, or None."""
    record = compilation_cache.load_value(key) if key is not None else None
    if _valid(record):
        STATS["plans_loaded"] += 1
        return record
    STATS["plans_built"] += 1
    return None


def store(key: str | None, record: tuple) -> None:
    if key is not None:
        compilation_cache.store_value(key, record)


def stats() -> dict:
    """Eager plans built from meta kernels in this process, and those read from the persistent cache."""
    return dict(STATS)
