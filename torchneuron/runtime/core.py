"""ctypes binding of the C++ core's small C ABI (csrc/neuron_core.cpp)."""
from __future__ import annotations

import ctypes
import glob
import os

import torch  # noqa: F401  (loads libc10/libtorch the core links against)


class StorageEvent(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int64),
        ("handle", ctypes.c_uint64),
        ("new_handle", ctypes.c_uint64),
        ("device", ctypes.c_int64),
        ("nbytes", ctypes.c_uint64),
        ("new_nbytes", ctypes.c_uint64),
    ]


EVENT_FREE, EVENT_GROW = 0, 1
SyncCallback = ctypes.CFUNCTYPE(None, ctypes.c_int64)


def _load() -> ctypes.CDLL:
    here = os.path.dirname(os.path.dirname(__file__))
    found = glob.glob(os.path.join(here, "_core*.so"))
    if not found:
        raise ImportError("torchneuron's C++ core is not built: run `pip install --no-build-isolation -e .`")
    lib = ctypes.CDLL(found[0])
    i64 = ctypes.c_int64
    signatures = {
        "tn_set_device_count": ([i64], None),
        "tn_set_sync_callback": ([SyncCallback], None),
        "tn_set_memory_limit": ([i64, i64], None),
        "tn_pending_events": ([], i64),
        "tn_take_events": ([ctypes.POINTER(StorageEvent), i64], i64),
        "tn_release_taken": ([], None),
        "tn_memory_allocated": ([i64], i64),
        "tn_current_stream": ([i64], i64),
    }
    for name, (args, res) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


lib = _load()
# Queued storage events, read without a foreign call on every op. `urgent` is set once a growth is
# queued (it must be applied before buffers are read) or enough frees have piled up to reclaim.
pending = ctypes.c_int64.in_dll(lib, "tn_pending")
urgent = ctypes.c_int64.in_dll(lib, "tn_pending_urgent")
