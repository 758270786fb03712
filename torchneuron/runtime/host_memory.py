"""Giving freed host memory back to the system, where device buffers live in host memory (XLA:CPU).

glibc's malloc keeps the memory of freed buffers for reuse. A loop over tensors of the same sizes
reuses it, but one whose sizes keep changing (a data loader's variable-length batches) allocates
each new size past the free holes, growing the heap: 1,000 uploads of lengths 1..97,000 floats,
each freed at once, grew resident memory by 190-210 MB with under 4 MB of live buffers. So once
every `CHECK_EVERY` freed bytes the heap's size is read (mallinfo2, about 4 µs), and where it grew
by more than `TRIM_AFTER` since the last trim (or since import), malloc_trim hands its free pages
back (about 4 ms): the same uploads then grow it by 15-30 MB. A steady loop stops growing the heap
after its first steps and is not trimmed again.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import threading

CHECK_EVERY = 16 << 20
TRIM_AFTER = 32 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _glibc():
    """libc's mallinfo2 and malloc_trim, or None where the allocator has none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallinfo2, malloc_trim = libc.mallinfo2, libc.malloc_trim
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    malloc_trim.argtypes = [ctypes.c_size_t]
    return mallinfo2, malloc_trim


_LIBC = _glibc()
_lock = threading.Lock()
_freed = 0  # bytes freed since the heap was last measured
_heap_after_trim = _LIBC[0]().arena if _LIBC is not None else 0  # the heap's size after the last trim
STATS = {"host_trims": 0}


def freed(nbytes: int) -> None:
    """Note `nbytes` of host memory freed (a storage's buffer, an executable); maybe trim."""
    global _freed
    _freed += nbytes
    if _freed >= CHECK_EVERY and _LIBC is not None:
        _check()


def _check() -> None:
    global _freed, _heap_after_trim
    with _lock:
        _freed = 0
        mallinfo2, malloc_trim = _LIBC
        if mallinfo2().arena - _heap_after_trim > TRIM_AFTER:
            malloc_trim(0)
            STATS["host_trims"] += 1
            _heap_after_trim = mallinfo2().arena
