"""The persistent compilation cache: XLA executables kept on disk, so a second run starts warm.

On by default in a per-user directory (`config.CACHE_DIR`: TORCHNEURON_CACHE_DIR names another,
empty or '0' turns it off), as JAX, inductor and TorchNeuron keep one. It is JAX's own cache,
configured with a size bound: that makes JAX take a file lock around every read and write, so
concurrent processes (torchrun ranks, the sweep's workers) never read a half-written entry. A
directory that cannot be written, or a write that fails later (a full disk), warns once and
leaves the process compiling without it; results never depend on the cache.
"""
from __future__ import annotations

import os
import tempfile
import threading
import warnings

import jax
from jax._src import compilation_cache as _jax_cache

from .. import config

# Disk the cache may fill before JAX evicts its least recently used entries.
DISK_LIMIT = 4 << 30
_disk_hits = [0]
_lock = threading.Lock()
_directory: str | None = None


def directory() -> str | None:
    """The cache directory in use, or None when the cache is off."""
    return _directory


def _usable(path: str) -> str | None:
    """None if `path` can hold the cache, else why not."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
            pass
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None


def _warn_off(path: str, why: str) -> None:
    warnings.warn(f"torchneuron: the compilation cache directory {path} is not usable ({why}); "
                  "compiling without a persistent cache (set TORCHNEURON_CACHE_DIR to another "
                  "directory, or to 0 to turn it off)", RuntimeWarning, stacklevel=2)


def enable(path: str | None) -> None:
    """Use `path` as the persistent cache (None: off)."""
    global _directory
    if path is not None:
        why = _usable(path)
        if why is not None:
            _warn_off(path, why)
            path = None
    _directory = path
    jax.config.update("jax_compilation_cache_dir", path)
    if path is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        jax.config.update("jax_compilation_cache_max_size", DISK_LIMIT)
    _jax_cache.reset_cache()  # JAX opens the (new) directory at its next compile


def _count(event: str, **kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _disk_hits[0] += 1


def compile(jitted, args, options=None):
    """(The executable of `jitted` for `args`, whether it came from the disk cache); `options`:
    XLA compiler options."""
    lowered = jitted.lower(*args)
    hits = _disk_hits[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    for w in caught:
        if "persistent compilation cache" in str(w.message):
            with _lock:
                if _directory is not None:  # warn once: the cache goes off
                    _warn_off(_directory, str(w.message))
                    enable(None)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return compiled, _disk_hits[0] != hits


# JAX warns for every entry it fails to read or write (compiles outside our Functions included);
# `compile` above sees them (its own filter) and turns the cache off with one warning.
warnings.filterwarnings("ignore", message="Error (writing|reading) persistent compilation cache entry")
jax.monitoring.register_event_listener(_count)
enable(config.CACHE_DIR)
