"""The persistent compilation cache: XLA executables kept on disk, so a second run starts warm.

On by default in a per-user directory (`config.CACHE_DIR`: TORCHNEURON_CACHE_DIR names another,
empty or '0' turns it off), as JAX, inductor and TorchNeuron keep one. JAX's compiler reads and
writes it through our store, `DirectoryStore`: each entry is written to a temporary file and renamed
into place, so concurrent processes (torchrun ranks, the sweep's workers) never read a half-written
entry and never wait on a lock. (JAX's own store with a size bound takes a lock and rescans the
whole directory on every write: quadratic, minutes over a test suite.) The disk bound is kept by
pruning the oldest entries when a process first writes to the cache (on a worker thread, and at most
once in `PRUNE_EVERY` seconds across processes: a scan of a full cache's hundred thousand entries
takes seconds, and `import torch` loads torchneuron) and each time it has written a tenth of the
bound. A directory that cannot be written, or a write that fails later (a full disk), warns once
and leaves the process compiling without it; results never depend on the cache.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import pathlib
import pickle
import tempfile
import threading
import time
import warnings

import jax
import jaxlib
import torch
from jax._src import compilation_cache as _jax_cache
from jax._src import config as _jax_config
from jax._src.compilation_cache_interface import CacheInterface
from jax.experimental.serialize_executable import deserialize_and_load, serialize

from .. import config
from .background import BackgroundQueue

# Disk the cache may fill; past it the least recently used entries go (DirectoryStore.prune).
DISK_LIMIT = 4 << 30
# A process's first write prunes the directory unless some process did in this many seconds (the
# mtime of the directory's PRUNED_MARKER says when): the bound may be overshot by what all processes
# write in that time, and no process start pays a scan.
PRUNE_EVERY = 600
PRUNED_MARKER = ".pruned"
_PRUNER = BackgroundQueue("torchneuron-cache-prune")
_disk_hits = threading.local()  # .count: JAX's persistent-cache hits on this thread
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


class DirectoryStore(CacheInterface):
    """Entries as files of one directory, each written whole or not at all (rename into place)."""

    def __init__(self, path: str):
        self._path = pathlib.Path(path)  # (JAX's CacheInterface: its reset_cache reads it)
        self._directory = str(path)  # (a warm start reads hundreds of entries: no pathlib per read)
        self._written = 0
        self._first_write = True

    def get(self, key: str) -> bytes | None:
        path = os.path.join(self._directory, key)
        try:
            with open(path, "rb") as f:
                value = f.read()
        except FileNotFoundError:
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # (recently used: pruned last)
        return value

    def put(self, key: str, value: bytes, replace: bool = False) -> None:
        target = os.path.join(self._directory, key)
        if not replace and os.path.exists(target):
            return
        with tempfile.NamedTemporaryFile(dir=self._directory, prefix=".partial-", delete=False) as f:
            try:
                f.write(value)
            except BaseException:
                os.unlink(f.name)
                raise
        os.replace(f.name, target)
        self._written += len(value)
        if self._first_write:
            self._first_write = False
            self._prune_unless_recent()
        if self._written > DISK_LIMIT // 10:
            self._written = 0
            self.prune()

    def _prune_unless_recent(self) -> None:
        """Prune on the worker thread, unless a process did in the last PRUNE_EVERY seconds."""
        marker = pathlib.Path(self._directory, PRUNED_MARKER)
        with contextlib.suppress(OSError):
            if time.time() - marker.stat().st_mtime < PRUNE_EVERY:
                return
        with contextlib.suppress(OSError):
            marker.touch()
        _PRUNER.submit(self.prune)

    def prune(self) -> None:
        """Oldest entries out until the directory holds at most three quarters of the bound."""
        try:
            entries = []
            for e in os.scandir(self._directory):
                if e.name != PRUNED_MARKER and e.is_file():
                    stat = e.stat()
                    entries.append((stat.st_mtime, stat.st_size, e.path))
        except OSError:
            return
        total = sum(size for _, size, _ in entries)
        if total <= DISK_LIMIT:
            return
        for _, size, path in sorted(entries):
            if total <= DISK_LIMIT * 3 // 4:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
                total -= size


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
    _jax_cache.reset_cache()
    if path is not None:  # JAX's compiler uses our store from now on
        _jax_cache._cache = DirectoryStore(path)
        _jax_cache._cache_initialized = True


# ------------------------------------------------------------------ executables by identity
# JAX's cache is keyed by the lowered module: a hit still traces and lowers the function (~8 ms for
# a small eager op, most of a warm start). A Function that can name everything its program depends
# on (an eager plan: its op, plan key and decisions) is also stored under that name, and loaded
# without tracing. The name includes a hash of torchneuron's own code, so an edited lowering
# never loads a stale program; the entries share the one store (DirectoryStore) and its bound.

_STORED_PREFIX = "torchneuron-"
_code_hash: list[str] = []


def _code_version() -> str:
    """A hash of torchneuron's sources and C++ core, and of the versions of what they build on."""
    if not _code_hash:
        versions = f"{jax.__version__} {jaxlib.__version__} {torch.__version__}"
        files = _code_files()
        # Reading and hashing the code (~6 MB) took ~10 ms of every process's start: a memo in the
        # cache names the hash of files of the same sizes and modification times (as Python
        # validates its .pyc files), so a warm process only lists them.
        memo = "code-version-" + hashlib.sha256(repr((versions, files)).encode()).hexdigest()
        found = load_value(memo, bundled=False) if _directory is not None else None
        if type(found) is not str:
            found = _hash_code(versions, files)
            if _directory is not None:
                store_value(memo, found, replace=True, bundled=False)
        _code_hash.append(found)
    return _code_hash[0]


def _code_files() -> list[tuple[str, int, int]]:
    """(path within the package, modification time in ns, size) of each of its sources and
    libraries, in path order."""
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    found = []
    for directory, subdirectories, names in os.walk(package):
        subdirectories[:] = [d for d in subdirectories if d != "__pycache__"]
        for name in names:
            if name.endswith((".py", ".so")):
                path = os.path.join(directory, name)
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    found.append((os.path.relpath(path, package), st.st_mtime_ns, st.st_size))
    return sorted(found)


def _hash_code(versions: str, files) -> str:
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    digest = hashlib.sha256(versions.encode())
    for relative, _, _ in files:
        digest.update(relative.encode())
        with open(os.path.join(package, relative), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def stored_key(identity: str, args, options, device=None) -> str | None:
    """The store's key of a program named `identity` compiled for `args` with `options` (to run on
    `device` where no argument is a device array), or None while the cache is off, the name holds a
    per-process value (an object's address) or nothing says where it runs."""
    if _directory is None or " at 0x" in identity:
        return None
    placed = _device_of(args) is None
    if placed and device is None:
        return None
    leaves, tree = jax.tree_util.tree_flatten(args)
    arguments = [(tuple(x.shape), str(x.dtype), bool(getattr(x, "weak_type", False)),
                  tuple(d.id for d in x.sharding.device_set) if isinstance(x, jax.Array) else None)
                 for x in leaves]
    text = repr((identity, str(tree), arguments, sorted((options or {}).items()), _settings(), _code_version()))
    if placed:
        text += f" on device {device.id}"
    return _STORED_PREFIX + hashlib.sha256(text.encode()).hexdigest()


def _settings() -> tuple:
    return (config.PLATFORM, config.CORES, config.DEVICE_ASSERTS, str(torch.get_default_dtype()),
            torch.are_deterministic_algorithms_enabled(), _device_kind())


@functools.cache
def _device_kind() -> str:
    return jax.devices()[0].device_kind


def output_avals_key(identity: str, avals: tuple) -> str | None:
    """The store's key of the output shapes and dtypes of a program named `identity` for inputs of
    `avals` ((shape, dtype) each), or None while the cache is off or the name is per-process."""
    return value_key("output avals", repr((identity, avals)))


def value_key(kind: str, text: str) -> str | None:
    """The store's key of a small value of `kind` named by `text` (what it depends on, as text),
    or None while the cache is off or the text holds a per-process value (an object's address)."""
    if _directory is None or " at 0x" in text:
        return None
    text = repr((text, kind, _settings(), _code_version()))
    return _STORED_PREFIX + hashlib.sha256(text.encode()).hexdigest()


# Small values (eager plans' records, programs' output shapes) are read by the hundred at a warm
# start, one file each (~60 µs, most of it opening the file). A process also leaves, at exit, the
# values it used (up to BUNDLED) in one bundle named after the first one it asked for: a later
# process whose first value is the same (the same program run again) reads the bundle then and
# finds the rest in memory. A bundle only spares reads: a value it lacks is read from its own file.
BUNDLED = 4096
_BUNDLE = "-values"
_bundle: dict = {}  # key -> value: the bundle read at the first value, then every value used since
_bundling = {"first": None, "changed": False}  # the first key asked for; whether a value was new to the bundle
_bundle_lock = threading.Lock()


def load_value(key: str, bundled: bool = True):
    """A small value stored under `key` (`store_value`), or None. `bundled`: kept in this process's
    bundle (not for values every program shares, which would name every program's bundle)."""
    if bundled:
        with _bundle_lock:
            if _bundling["first"] is None:
                _bundling["first"] = key
                found = _read_value(key + _BUNDLE)
                if type(found) is dict:
                    _bundle.update(found)
            found = _bundle.get(key)
        if found is not None:
            return found
    found = _read_value(key)
    if found is not None and bundled:
        _note_value(key, found)
    return found


def _read_value(key: str):
    store = _store()
    try:
        blob = store.get(key) if store is not None else None
        return None if blob is None else pickle.loads(blob)
    except Exception:  # noqa: BLE001  (torn or foreign: recomputed, and the next store replaces it)
        return None


def store_value(key: str, value, replace: bool = False, bundled: bool = True) -> None:
    """Keep a small picklable value under `key` (a failed write only loses it); `replace`: in place
    of one stored before (else that one stays); `bundled` as for load_value."""
    target = _store()
    if target is not None:
        with contextlib.suppress(Exception):
            target.put(key, pickle.dumps(value), replace=replace)
        if bundled:
            _note_value(key, value)


def _note_value(key: str, value) -> None:
    with _bundle_lock:
        if len(_bundle) < BUNDLED and key not in _bundle:
            _bundle[key] = value
            _bundling["changed"] = True


def _forked() -> None:
    global _bundle_lock
    _bundle_lock = threading.Lock()  # (another thread of the parent may have held it)


os.register_at_fork(after_in_child=_forked)


@atexit.register
def _store_bundle() -> None:
    """(At exit) the values this process used, under its first value's key, where its bundle lacked some."""
    with _bundle_lock:
        first, changed, bundle = _bundling["first"], _bundling["changed"], dict(_bundle)
    if first is not None and changed:
        store_value(first + _BUNDLE, bundle, replace=True, bundled=False)


def _store():
    return _jax_cache._cache if _directory is not None else None


def _device_of(args):
    """The one device the arguments live on (a stored program runs where it is loaded), or None."""
    devices = {d for x in jax.tree_util.tree_leaves(args) if isinstance(x, jax.Array) for d in x.sharding.device_set}
    return devices.pop() if len(devices) == 1 else None


# XLA:CPU's LAPACK kernels (linalg ops) look their routines up when a program using them is first
# lowered in the process; a program loaded untraced must have them looked up first, or its first call
# jumps through an empty pointer and the process dies (SIGSEGV).
_LAPACK_TARGET = b"lapack_"


def _initialize_lapack() -> None:
    from jax._src.lib import lapack  # (once per process: ~0.2 s, so only for programs that need it)

    lapack._lapack.initialize()


def load(key: str, args, device=None):
    """(The compiled executable stored under `key`, loaded onto the device of `args` (`device` where
    no argument is a device array), the seconds its compile took, its device-assert messages by
    id), or None (absent, unreadable or stale)."""
    return load_onto(key, target_of(args, device))


def target_of(args, device=None):
    """The device a program for `args` runs on: their one device, else `device` (may be None)."""
    return _device_of(args) or device


def load_onto(key: str, target):
    """`load`, onto the device `target` (None: nothing to load it onto)."""
    store = _store()
    try:
        blob = store.get(key) if store is not None and target is not None else None
        if blob is None:
            return None
        if _LAPACK_TARGET in blob:
            _initialize_lapack()
        serialized, seconds, messages = pickle.loads(blob)
        return deserialize_and_load(*serialized, execution_devices=[target]), seconds, messages
    except Exception:  # noqa: BLE001  (a torn or foreign entry: compile instead; the next store replaces it)
        return None


def store(key: str, compiled, seconds: float, messages: dict) -> None:
    """Store `compiled` under `key` with the seconds its compile took (a process that loads it
    weighs a recompile at full optimisation by what compiling cost, not by what loading did) and
    the messages of its device asserts (id -> message: the process that loads it reports them)."""
    target = _store()
    if target is None:
        return
    try:
        target.put(key, pickle.dumps((serialize(compiled), seconds, messages)))
    except Exception as e:  # noqa: BLE001  (a full disk, an unserialisable program): once, then uncached
        with _lock:
            if _directory is not None:
                _warn_off(_directory, f"{type(e).__name__}: {e}")
                enable(None)


def _count(event: str, **kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":  # (recorded on the thread that compiles)
        _disk_hits.count = _hits_here() + 1


def _hits_here() -> int:
    return getattr(_disk_hits, "count", 0)


def _jax_writes(named: bool):
    """JAX's own store writes every compile it did not find; a program we store under its name
    (`store`) would be written twice (serialising a segment took a tenth of a cold fused run)."""
    return _jax_config.persistent_cache_min_compile_time_secs(float("inf")) if named else contextlib.nullcontext()


def compile(jitted, args, options=None, named: bool = False):
    """(The executable of `jitted` for `args`, whether it came from the disk cache, the lowered
    program it was compiled from); `options`: XLA compiler options; `named`: the caller stores it
    under its name, JAX's cache need not."""
    lowered = jitted.lower(*args)
    hits = _hits_here()
    with warnings.catch_warnings(record=True) as caught, _jax_writes(named):
        warnings.simplefilter("always")
        compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    for w in caught:
        if "Error writing persistent compilation cache" in str(w.message):
            with _lock:
                if _directory is not None:  # warn once: the cache goes off
                    _warn_off(_directory, str(w.message))
                    enable(None)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return compiled, _hits_here() != hits, lowered


def compile_again(lowered, options=None, named: bool = False):
    """(An executable of `lowered` compiled with `options`, whether it came from the disk cache),
    on a worker thread: no warnings are caught here (catching them is not thread-safe; JAX's
    cache warnings are filtered below), so a failed cache write only loses that entry."""
    hits = _hits_here()
    with _jax_writes(named):
        compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    return compiled, _hits_here() != hits


# JAX warns for every entry it fails to read or write (compiles outside our Functions included);
# `compile` above sees them (its own filter): a failed write turns the cache off with one warning, a
# failed read (a foreign or damaged entry) just compiles.
warnings.filterwarnings("ignore", message="Error (writing|reading) persistent compilation cache entry")
jax.monitoring.register_event_listener(_count)
enable(config.CACHE_DIR)
