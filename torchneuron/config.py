"""Environment variables, read once at import into this module's attributes. One table so they are easy to
audit and document.

The code reads the attributes where it uses them (`config.DEVICE_ASSERTS`, `"recompiles" in config.LOG`),
never a copy, so a test or a user changes a setting at run time by assigning it:
`torchneuron.config.EAGER_BUCKETS = False`. A setting that decides what an executable holds (device
asserts, buckets) applies to the programs built after it. The settings in AT_IMPORT configure JAX or the
process once, at import; each names what changes it later, if anything.
"""
from __future__ import annotations

import os

ENVIRONMENT = {
    "TORCHNEURON_PLATFORM": "PJRT platform the NeuronCores live on (cpu, cuda, tpu, neuron); default cpu",
    "TORCHNEURON_CORES": "number of NeuronCores on the cpu platform; default 2",
    "TORCHNEURON_MEMORY_LIMIT": "bytes each NeuronCore may hold before torch.OutOfMemoryError",
    "TORCHNEURON_FALLBACK": "'cpu' (default) runs ops without a lowering on CPU, counted; 'error' refuses",
    "TORCHNEURON_ASYNC_DISPATCH": "'1' (default) queues XLA:CPU work on its worker threads, as accelerators "
                                  "do; '0' runs every program inline on the calling thread",
    "TORCHNEURON_AUTOGRAD_THREADS": "'1' keeps PyTorch's per-device backward threads; default '0' runs "
                                    "backward on the thread that calls it",
    "TORCHNEURON_CACHE_DIR": "directory of the persistent compilation cache (eager ops and compiled graphs); "
                             "default ~/.cache/torchneuron/xla ($XDG_CACHE_HOME respected); empty or '0' "
                             "turns it off",
    "TORCHNEURON_CACHE_LIMIT": "bytes of compiled executables kept in memory (suffix K, M or G allowed), "
                               "least recently used evicted; default 2G",
    "TORCHNEURON_CACHE_PREFETCH": "programs a process loads ahead from the persistent cache, in the order "
                                  "the processes before it asked for them, on a worker thread; default "
                                  "16, '0' turns it off",
    "TORCHNEURON_LOG": "comma-separated topics to log; 'recompiles' logs why torch.compile recompiled "
                       "and which eager op compiled for new shapes; 'flushes' logs why each fused eager "
                       "segment ran",
    "TORCHNEURON_EAGER": "default 'fused' defers eager ops and runs them as fused segments when a value "
                         "is needed; 'strict' runs each eager op as it is called",
    "TORCHNEURON_BUCKETS": "'0' compiles dynamic graphs at exact sizes; default '1' rounds dynamic sizes "
                           "up to power-of-two buckets",
    "TORCHNEURON_EAGER_BUCKETS": "default '1' runs an eager op whose calls grow along one size at that "
                                 "size's bucket; '0' runs every eager op at its exact sizes",
    "TORCHNEURON_MIN_BUCKET": "smallest shape bucket of a dynamic size; default 8",
    "TORCHNEURON_LAUNCH_BLOCKING": "'1' raises a device-side assert (an index out of bounds) at the op "
                                   "itself, as CUDA_LAUNCH_BLOCKING; default '0' raises it at the next "
                                   "synchronisation",
    "TORCHNEURON_DEVICE_ASSERTS": "'0' compiles ops without their device-side checks (index bounds); "
                                  "default '1'",
    "TORCHNEURON_XLA_COLLECTIVES": "'1' under torchrun starts JAX's multi-process runtime (gloo collectives "
                                   "on cpu) and compiles graphs with world-group collectives as one XLA "
                                   "program per rank; default '0' runs them between compiled segments",
    "TORCHNEURON_GENERATE_GRAPHS": "default '1': Hugging Face generate on neuron, when the caller chose no "
                                   "cache, decodes with a static cache of the generation's bucketed length "
                                   "and replays each decode step as one recorded graph; '0' keeps "
                                   "transformers' default (dynamic) cache",
    "TORCHNEURON_JAX_COORDINATOR": "host:port of JAX's multi-process coordinator (with "
                                   "TORCHNEURON_XLA_COLLECTIVES=1); default MASTER_ADDR:MASTER_PORT+1",
}

AT_IMPORT = {
    "TORCHNEURON_PLATFORM": "fixed: JAX's platform is chosen once",
    "TORCHNEURON_CORES": "fixed: the device count is registered once",
    "TORCHNEURON_MEMORY_LIMIT": "fixed: each core's limit is set when the device registers",
    "TORCHNEURON_ASYNC_DISPATCH": "fixed: JAX's XLA:CPU client is made once",
    "TORCHNEURON_AUTOGRAD_THREADS": "torch.autograd.set_multithreading_enabled",
    "TORCHNEURON_CACHE_DIR": "torchneuron.runtime.compilation_cache.enable(directory)",
    "TORCHNEURON_CACHE_LIMIT": "torchneuron.set_cache_limit(bytes)",
    "TORCHNEURON_EAGER": "torchneuron.eager_mode(mode), a block",
    "TORCHNEURON_XLA_COLLECTIVES": "fixed: JAX's multi-process runtime starts at import",
    "TORCHNEURON_JAX_COORDINATOR": "fixed: JAX's multi-process runtime starts at import",
}

PLATFORM = os.environ.get("TORCHNEURON_PLATFORM", "cpu")
CORES = int(os.environ.get("TORCHNEURON_CORES", "2"))
MEMORY_LIMIT = os.environ.get("TORCHNEURON_MEMORY_LIMIT")
FALLBACK = os.environ.get("TORCHNEURON_FALLBACK", "cpu")
# Fused by default since the suite, the conformance run and the benchmarks showed it equal or better
# (docs/DEFERRED.md); strict stays a setting, and `torchneuron.eager_mode("strict")` a block.
EAGER = os.environ.get("TORCHNEURON_EAGER", "fused")
if EAGER not in ("strict", "fused"):
    raise ValueError(f"TORCHNEURON_EAGER={EAGER!r}: expected 'strict' or 'fused'")
# Asynchronous dispatch on XLA:CPU, as on every accelerator: a program returns once queued, so the
# host's next ops (Python, the dispatcher, recording) overlap its work. XLA:CPU still runs programs
# of under 1,000 flops inline (a 64-element add), so small eager ops pay no hand-off. Measured on
# the small GPT's training step: compiled and strict eager about a quarter faster (docs/DESIGN.md).
ASYNC_DISPATCH = os.environ.get("TORCHNEURON_ASYNC_DISPATCH", "1") == "1"
# The autograd engine runs an accelerator's backward on a worker thread per device. Our device work
# is already queued by XLA, so the thread only adds two hand-offs per backward (~0.1 ms) and runs
# each Python kernel more slowly than the calling thread; the GIL allows no overlap to win back.
AUTOGRAD_THREADS = os.environ.get("TORCHNEURON_AUTOGRAD_THREADS", "0") == "1"


def _cache_dir() -> str | None:
    value = os.environ.get("TORCHNEURON_CACHE_DIR")
    if value is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "torchneuron", "xla")
    return None if value.strip() in ("", "0") else value


def _bytes(text: str) -> int:
    """'1G', '512M', '64K' or a plain number of bytes."""
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


CACHE_DIR = _cache_dir()
CACHE_PREFETCH = int(os.environ.get("TORCHNEURON_CACHE_PREFETCH", "16"))
CACHE_LIMIT = _bytes(os.environ.get("TORCHNEURON_CACHE_LIMIT", "2G"))
LOG = frozenset(topic.strip() for topic in os.environ.get("TORCHNEURON_LOG", "").split(",") if topic.strip())
BUCKETS = os.environ.get("TORCHNEURON_BUCKETS", "1") != "0"
EAGER_BUCKETS = os.environ.get("TORCHNEURON_EAGER_BUCKETS", "1") != "0"
MIN_BUCKET = int(os.environ.get("TORCHNEURON_MIN_BUCKET", "8"))
LAUNCH_BLOCKING = os.environ.get("TORCHNEURON_LAUNCH_BLOCKING", "0") == "1"
DEVICE_ASSERTS = os.environ.get("TORCHNEURON_DEVICE_ASSERTS", "1") != "0"
XLA_COLLECTIVES = os.environ.get("TORCHNEURON_XLA_COLLECTIVES", "0") == "1"
JAX_COORDINATOR = os.environ.get("TORCHNEURON_JAX_COORDINATOR")
GENERATE_GRAPHS = os.environ.get("TORCHNEURON_GENERATE_GRAPHS", "1") != "0"
