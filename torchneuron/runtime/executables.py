"""Every XLA executable torchneuron compiles, in one memory-bounded cache.

A `Function` is a JAX function compiled ahead of time once per argument signature (shapes,
dtypes, devices). Its executables live in `CACHE`, which holds at most `config.CACHE_LIMIT`
bytes of them and evicts the least recently used (a second-chance clock: a function called since
the last sweep survives it), so a program that meets endless new shapes keeps bounded memory. An
evicted signature compiles again on its next call (from the persistent cache on disk, when on).

JAX keeps its own caches of traces, lowerings and executables (up to thousands of entries each,
about 1.5 MB of resident memory per small XLA:CPU executable, whatever we drop); after evictions
they are cleared, which only our `Function`s outlive: they hold their compiled executables
themselves and are called directly, never through `jax.jit`'s own cache.

The per-call path is one attribute bump and the compiled executable's own C++ call: a call with a
signature it was not compiled for raises TypeError (another device: ValueError) before running
anything, and only then does the function look up (or compile) the executable for the new signature.
"""
from __future__ import annotations

import collections
import functools
import os
import threading
import time
import warnings

import jax

from .. import config
from . import assert_messages, compilation_cache, host_memory, prefetch, tables
from .background import BackgroundQueue, stopping

_PAGE = os.sysconf("SC_PAGE_SIZE")
# Evictions between clears of JAX's own caches: each clear costs a retrace of whatever is compiled
# next, so they are batched (the bound is exceeded by at most this many small executables).
_CLEAR_EVERY = 32
# A small XLA:CPU executable's resident cost until measured (XLA:CPU reports no code size).
_DEFAULT_ENTRY_BYTES = 1 << 20
_MIN_ENTRY_BYTES = 64 << 10


# Small eager programs compile first with LLVM's cheaper optimisation, where the code runs for
# microseconds either way; larger ones (and compiled graphs, which run many times) keep the full
# pipeline. A quick program whose calls add up recompiles at full optimisation (`_Tiered`):
# unoptimised code runs compute-heavy ops (attention, gelu's tanh, layer norm) 4-8x slower.
# Quick programs also skip XLA:CPU's MLIR fusion emitters for its older LLVM IR emitters: a small
# program compiles 2-3x faster (about 20-35 against 55-110 ms, measured on 40 small reductions
# under load), and runs at the same speed at this optimisation level (softmax, matmul, attention,
# reductions within the noise; a tiny add a few microseconds slower).
# They also compile their LLVM module whole: split for parallel codegen (the default), the parts
# cost more than they save on two cores (the cold `generate`'s quick programs compiled in 3.25
# against 4.21 s for fused eager's segments, 3.16 against 3.46 s for strict eager's single ops).
_QUICK = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False,
          "xla_cpu_parallel_codegen_split_count": 1}
_QUICK_BYTES = 1 << 20
_QUICK_PLATFORM = config.PLATFORM == "cpu"  # (measured there; accelerators' compilers differ)
# Single ops' programs, and fused eager's segments; compiled and captured graphs run many ops many
# times. A segment compiles quick (a decode step's: 2-3x faster), and once it has been called
# `_BACKGROUND_AFTER` times (a loop's body) it compiles again at full optimisation on a worker thread
# (XLA compiles without the GIL) and takes the quick one's place when ready: a cold `generate` pays
# quick compiles, a training loop soon runs full-speed code. Sooner would compile most of a
# `generate`'s segments twice, each used a few times more (a bucket's decode steps), and on two
# cores that compile slows the calling thread by more than the full program saves. (A segment
# loaded quick from disk is lowered again on the worker for its promotion.)
_QUICK_KINDS = ("eager", "runtime", "segment")
_BACKGROUND_KINDS = ("segment",)
_BACKGROUND_AFTER = 16
# A promotion starts once the calling threads have compiled nothing for this long: a cold `generate`
# compiles a new bucket's segments every few dozen steps, and a promotion beside those compiles slows
# them by more than it saves (XLA:CPU compiles on both cores; cold `generate` 6.45 -> 5.6 s waiting).
# A loop that has stopped compiling (a training loop's steady state) promotes as before.
_QUIET_SECONDS = 0.5


# Calls at which a quick executable weighs a recompile: its measured time times the calls so far,
# against what the full compile costs (ski rental: pay for it once the calls already paid as much).
_TIER_CHECKS = (4, 16, 64, 256, 1024, 4096)
_TIER_GAIN = 0.75  # the share of a call's time the full pipeline is assumed to save (4-8x on compute-heavy ops)
_FULL_OVER_QUICK = 1.4  # a full compile's seconds over a quick one's


# What an executable raises, before running anything, for arguments it was not compiled for: another
# signature (TypeError) or another device (ValueError: "compiled for input shardings that disagree").
NOT_COMPILED_FOR = (TypeError, ValueError)


def _not_compiled(*args):
    raise TypeError("not compiled for these arguments")


class Function:
    """`fn` compiled once per argument signature; call it as `fn` (or, on hot paths, try
    `self.compiled(*args)` and call `self.call_new(args)` on NOT_COMPILED_FOR, counting `self.calls`)."""

    __slots__ = (
        "__weakref__",
        "_jit_options",
        "_jitted",
        "calls",
        "compiled",
        "device",
        "fn",
        "identity",
        "kind",
        "messages",
        "name",
        "on_empty",
        "out_avals",
        "seen",
        "segments",
        "signatures",
    )

    def __init__(self, fn, kind: str, name: str, donate_argnums=(), on_empty=None, identity=None,
                 device=None, **jit_options):
        self.fn = fn  # (deferred execution composes functions' bodies into one program)
        if device is not None:  # no array argument says where it runs (factories): its results go there
            jit_options.setdefault("out_shardings", jax.sharding.SingleDeviceSharding(device))
        # jax.jit when first traced: a program loaded by name is never traced (~0.1 ms a function)
        self._jitted = None
        self._jit_options = dict(jit_options, donate_argnums=donate_argnums)
        # the device its program runs on when no argument is a device array (a stored program is
        # loaded onto its arguments' device, else onto this one)
        self.device = device
        # everything the program depends on besides its arguments, as text (None: not nameable);
        # with it the persistent cache loads the program without tracing it
        self.identity = identity
        self.kind = kind  # "eager", "compile" or "runtime": cache_stats() reports each
        self.messages: set = set()  # ids of the device-assert messages its traces made (stored with it)
        self.name = name
        self.compiled = _not_compiled  # the executable of the latest signature
        self.calls = 0  # calls through the hot path (hits = calls - misses)
        self.seen = 0  # calls at the clock's last sweep
        self.signatures: dict = {}  # signature -> compiled executable
        self.on_empty = on_empty  # called once the cache evicted every executable of this function
        self.out_avals: dict = {}  # input (shape, dtype)s -> its outputs' (fused eager records by them)
        self.segments = 0  # cached fused segments whose programs run it (runtime/deferred.py)

    @property
    def jitted(self):
        """`fn` under jax.jit (made at the first trace)."""
        jitted = self._jitted
        if jitted is None:
            jitted = self._jitted = jax.jit(self.fn, **self._jit_options)
        return jitted

    def __call__(self, *args):
        self.calls += 1
        try:
            return self.compiled(*args)
        except NOT_COMPILED_FOR:
            return self.call_new(args)

    def call_new(self, args):
        """A call whose signature is not the latest one's: find or compile its executable."""
        signature = _signature(args)
        compiled = self.signatures.get(signature)
        if compiled is None:
            compiled = CACHE.compile(self, signature, args)
        self.compiled = compiled
        return compiled(*args)


def when_empty(function: Function, callback, token=None) -> None:
    """Also call `callback` once the cache has evicted every executable of `function`. A later
    callback with the same `token` (default: the callback itself) replaces it: the plans of a
    shared program register one each, and one built again must not add another."""
    callbacks = function.on_empty
    if type(callbacks) is not _Callbacks:
        callbacks = function.on_empty = _Callbacks() if callbacks is None else _Callbacks({callbacks: callbacks})
    callbacks[callback if token is None else token] = callback


def forget_when_empty(function: Function, token) -> None:
    """Drop the callback registered with `token` (its table forgot the entry it would drop)."""
    callbacks = function.on_empty
    if type(callbacks) is _Callbacks:
        callbacks.pop(token, None)


class _Callbacks(dict):
    """token -> callback, called in turn (a dict, not a chain of pairs: a program shared by
    thousands of plans, a view's at each offset, would nest past Python's recursion limit)."""

    __slots__ = ()

    def __call__(self):
        for callback in list(self.values()):
            callback()


def _signature(args) -> tuple:
    leaves, tree = jax.tree_util.tree_flatten(args)
    return (tree, *[(x.shape, x.dtype, getattr(x, "weak_type", False),
                     x.sharding if isinstance(x, jax.Array) else None) if hasattr(x, "dtype")
                    else (type(x), x) for x in leaves])


def _like(args) -> tuple:
    """Stand-ins for `args` to lower a program for (a worker's job holds no device buffers)."""
    return tuple(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding, weak_type=x.weak_type)
                 if isinstance(x, jax.Array) else x for x in args)


def _argument_bytes(args) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(args) if hasattr(x, "dtype"))


def _direct_call(compiled):
    """The compiled executable's C++ call: `Compiled.__call__` is a Python frame around it (0.3 µs
    per eager op). It refuses another signature with the same TypeError."""
    make = getattr(getattr(compiled, "_executable", None), "create_cpp_call", None)
    call = make(compiled._params) if make is not None else None
    return call if call is not None else compiled


class _Tiered:
    """A quick executable on the hot path, counting its calls: at each of `_TIER_CHECKS` it times one
    call, and once the time spent pays for a full compile the next call recompiles in its place (with
    that call's arguments: the cache's key and device come from them). After the last check it hands
    the hot path the bare executable."""

    __slots__ = ("background", "call", "calls", "compile_seconds", "entry", "next_check", "promote")

    def __init__(self, call, entry, compile_seconds: float, background=None):
        self.call = call
        self.entry = entry  # (function, signature)
        self.compile_seconds = compile_seconds
        self.calls = 0
        self.next_check = _TIER_CHECKS[0]
        self.promote = False
        # (lowered program or None, store key of the full one, of this one): promoted off-thread
        self.background = background

    def __call__(self, *args):
        self.calls += 1
        if self.calls < self.next_check:
            return self.call(*args)
        if self.background is not None:
            if _signature(args)[1:] != self.entry[1][1:]:  # another signature's call: it raises, and lends no shapes
                return self.call(*args)
            if self.calls < _BACKGROUND_AFTER:
                self.next_check = _BACKGROUND_AFTER
            else:
                self.next_check = float("inf")  # (the promotion replaces this entry when it is ready)
                # (loaded from disk, it has no lowered program: the worker lowers one for stand-ins of these args)
                like = _like(args) if self.background[0] is None else None
                _PROMOTER.submit(functools.partial(CACHE.promote_in_background, self, like))
            return self.call(*args)
        if self.promote and _signature(args)[1:] == self.entry[1][1:]:  # (the hot path's args are a list)
            return CACHE.promote(self, args)(*args)
        jax.block_until_ready(args)
        started = time.perf_counter()
        outputs = self.call(*args)  # (a wrong signature raises here, before running, as without us)
        jax.block_until_ready(outputs)
        seconds = time.perf_counter() - started
        later = [n for n in _TIER_CHECKS if n > self.calls]
        if seconds * self.calls * _TIER_GAIN >= self.compile_seconds * _FULL_OVER_QUICK:
            self.promote, self.next_check = True, self.calls + 1
        elif later:
            self.next_check = later[0]
        else:
            CACHE.settle(self)
        return outputs


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class ExecutableCache:
    """The compiled executables of every Function, least recently used evicted past the limit."""

    def __init__(self, limit: int):
        self.limit = limit
        self.entries: collections.OrderedDict = collections.OrderedDict()  # (function, signature) -> bytes
        self.bytes = 0
        self.stats = collections.Counter()  # misses, evictions, compiles, disk_hits, ...
        self.by_kind = collections.Counter()  # kind -> entries
        self.evicted_calls = 0  # hot-path calls of functions since evicted entirely
        self._evicted_since_clear = 0
        self.compiling = 0  # compiles in progress on calling threads
        self.last_compile = 0.0  # time.monotonic() when the latest of them ended
        self._typical: list[int] = []  # measured resident costs of the first compiles
        self._samples = 0
        self._lock = threading.RLock()

    def compile(self, function: Function, signature, args, full: bool = False):
        """Compile (or load) `function`'s executable for `args` and hold it; returns it."""
        with self._lock:
            self.compiling += 1
            try:
                return self._compile(function, signature, args, full)
            finally:
                self.compiling -= 1
                self.last_compile = time.monotonic()

    def _compile(self, function: Function, signature, args, full: bool):
        """(Under the lock) the body of compile()."""
        if not full:  # (a promotion is no miss: the quick executable served every call so far)
            self.stats["misses"] += 1
        before, started = _resident(), time.perf_counter()
        quick = not full and _QUICK_PLATFORM and function.kind in _QUICK_KINDS \
            and _argument_bytes(args) <= _QUICK_BYTES
        options = _QUICK if quick else None
        key = compilation_cache.stored_key(function.identity, args, options, function.device) \
            if function.identity else None
        background = quick and function.kind in _BACKGROUND_KINDS
        full_key = compilation_cache.stored_key(function.identity, args, None, function.device) \
            if background and function.identity else None
        loaded, ahead = prefetch.load(full_key, args, function.device) if full_key is not None else (None, False)
        if loaded is not None:  # promoted in an earlier process: its full executable
            quick = background = False
        elif key is not None:
            loaded, ahead = prefetch.load(key, args, function.device)
        from_disk = loaded is not None
        self.stats["untraced_loads"] += from_disk
        lowered = None
        if loaded is None:
            with assert_messages.collected() as messages:
                compiled, from_disk, lowered = compilation_cache.compile(function.jitted, args, options,
                                                                         named=key is not None)
            compiling = time.perf_counter() - started
            # (a retrace JAX serves from its own cache collects nothing: the function keeps the union)
            function.messages |= messages
            if key is not None and not from_disk:  # (XLA:CPU: one loaded from disk serialises without its code)
                compilation_cache.store(key, compiled, compiling, assert_messages.messages_of(function.messages))
                prefetch.noted(key, compilation_cache.target_of(args, function.device))
        else:
            compiled, compiling, messages = loaded
            assert_messages.register(messages)
            function.messages |= set(messages)
        compiled = _direct_call(compiled)
        seconds = time.perf_counter() - started
        self.stats["compile_seconds"] += seconds
        self.stats["disk_hits" if from_disk else "compiles"] += 1
        if quick:  # (weighed by what a compile costs: a promotion found on disk is cheaper still)
            compiled = _Tiered(compiled, (function, signature), max(seconds, compiling),
                               (lowered, full_key, key) if background else None)
        # (one the prefetch worker loaded grew memory on its thread: the typical cost, unsampled)
        size = self._entry_bytes(None if ahead else _resident() - before)
        function.signatures[signature] = compiled
        self.entries[(function, signature)] = size
        self.bytes += size
        self.by_kind[function.kind] += 1
        self._evict(keep=(function, signature))
        return compiled

    def promote(self, tiered: _Tiered, args):
        """Recompile a quick executable at full optimisation for `args` (its signature), in its place;
        returns the executable to call."""
        function, signature = tiered.entry
        with self._lock:
            if function.signatures.get(signature) is not tiered:  # evicted meanwhile
                return tiered.call
            self.bytes -= self.entries.pop(tiered.entry)
            del function.signatures[signature]
            self.by_kind[function.kind] -= 1
            self.stats["promotions"] += 1
            compiled = self.compile(function, signature, args, full=True)
            if function.compiled is tiered:
                function.compiled = compiled
            return compiled

    def promote_in_background(self, tiered: _Tiered, like) -> None:
        """(On the worker thread) compile a quick executable's program at full optimisation (lowered
        here for arguments `like` its calls' where it was loaded from disk) and put it in the quick
        one's place, unless the cache dropped that entry meanwhile."""
        function, signature = tiered.entry
        lowered, key, quick_key = tiered.background
        tiered.background = None
        if not self._quiet():
            return
        if function.signatures.get(signature) is not tiered:
            return
        started = time.perf_counter()
        try:
            if lowered is None:
                lowered = function.jitted.lower(*like)
            compiled, from_disk = compilation_cache.compile_again(lowered, named=key is not None)
        except Exception:  # noqa: BLE001  (it keeps running quick, as it did)
            self.settle(tiered)
            return
        seconds = time.perf_counter() - started
        if key is not None and not from_disk:  # (XLA:CPU: one loaded from disk serialises without its code)
            compilation_cache.store(key, compiled, seconds, assert_messages.messages_of(function.messages))
        if key is not None and quick_key is not None:  # (a later process loads the full one in its place)
            prefetch.replaced(quick_key, key)
        compiled = _direct_call(compiled)
        with self._lock:
            if function.signatures.get(signature) is not tiered:
                return
            function.signatures[signature] = compiled
            if function.compiled is tiered:
                function.compiled = compiled
            self.stats["promotions"] += 1
            self.stats["compile_seconds"] += seconds

    def _quiet(self) -> bool:
        """(On the worker) wait until no calling thread has compiled for `_QUIET_SECONDS`; False: the
        process ends."""
        while not stopping():
            idle = time.monotonic() - self.last_compile
            if not self.compiling and idle >= _QUIET_SECONDS:
                return True
            time.sleep(max(_QUIET_SECONDS - idle, 0.05))
        return False

    def settle(self, tiered: _Tiered) -> None:
        """A quick executable that stays quick: the hot path calls it bare from now on."""
        function, signature = tiered.entry
        with self._lock:
            if function.signatures.get(signature) is tiered:
                function.signatures[signature] = tiered.call
                if function.compiled is tiered:
                    function.compiled = tiered.call

    def _entry_bytes(self, grew: int | None) -> int:
        """An executable's estimated resident cost: the mean growth across the process's first
        compiles (the very first also loads the compiler: left out; one that reused freed memory
        counts as growing nothing), or what this compile grew where that is far more (a large graph).
        None: not measured here (loaded on another thread), the typical cost."""
        if grew is not None:
            self._samples += 1
            if self._samples > 1 and len(self._typical) < 64:
                self._typical.append(max(grew, 0))
        typical = max(sum(self._typical) // len(self._typical), _MIN_ENTRY_BYTES) if self._typical \
            else _DEFAULT_ENTRY_BYTES
        return grew if grew is not None and len(self._typical) >= 8 and grew > 4 * typical else typical

    def _evict(self, keep) -> None:
        """Second chance: the oldest entry goes unless its function was called since the last sweep
        (then it moves to the back, marked); newest entry always stays."""
        spared = 0
        while self.bytes > self.limit and len(self.entries) > 1:
            entry = next(iter(self.entries))
            function = entry[0]
            if entry != keep and function.calls == function.seen:
                self._remove(entry)
                continue
            function.seen = function.calls
            self.entries.move_to_end(entry)
            spared += 1
            if spared > len(self.entries):  # everything was in use: evict in plain LRU order
                self._remove(next(e for e in self.entries if e != keep))
        if self._evicted_since_clear >= _CLEAR_EVERY:
            self._evicted_since_clear = 0
            jax.clear_caches()  # JAX's own caches of what we dropped (our Functions keep theirs)

    def _remove(self, entry) -> None:
        function, signature = entry
        size = self.entries.pop(entry)
        self.bytes -= size
        host_memory.freed(size)
        compiled = function.signatures.pop(signature)
        if function.compiled is compiled:
            function.compiled = _not_compiled
        self.by_kind[function.kind] -= 1
        self.stats["evictions"] += 1
        self._evicted_since_clear += 1
        if not function.signatures:  # its calls so far counted here (it may compile again)
            self.evicted_calls += function.calls
            function.calls = function.seen = 0
            if function.on_empty is not None:
                function.on_empty()

    def set_limit(self, limit: int) -> None:
        with self._lock:
            self.limit = limit
            self._evict(keep=None)

    def report(self) -> dict:
        with self._lock:
            calls = self.evicted_calls + sum(f.calls for f in {f for f, _ in self.entries})
            stats = self.stats
            return {
                "entries": len(self.entries), "bytes": self.bytes, "limit": self.limit,
                "hits": calls - stats["misses"],  # every call either compiled (a miss) or found one
                "misses": stats["misses"], "evictions": stats["evictions"],
                "compiles": stats["compiles"], "disk_hits": stats["disk_hits"],
                "promotions": stats["promotions"],
                "untraced_loads": stats["untraced_loads"],
                **prefetch.stats(),
                "compile_seconds": stats["compile_seconds"],
                "entries_by_kind": {k: v for k, v in self.by_kind.items() if v},
                "persistent_cache": compilation_cache.directory(),
                # the plan, program and segment tables (entries, limit), and host memory handed back
                "tables": tables.report(),
                **host_memory.STATS,
            }


CACHE = ExecutableCache(config.CACHE_LIMIT)


_PROMOTER = BackgroundQueue("torchneuron-promote")


def wait_for_promotions() -> None:
    """Return once the background compiles submitted so far have finished (benchmarks that time
    a steady state, tests)."""
    _PROMOTER.wait()


def cache_stats() -> dict:
    """The executable cache: entries, bytes (estimated resident), limit, hits, misses, evictions;
    of the misses, XLA compiles and persistent-cache loads (disk_hits; of them untraced_loads, the
    eager plans loaded by name without tracing), and their seconds."""
    return CACHE.report()


def set_cache_limit(limit: int) -> None:
    """Hold at most `limit` bytes of executables (evicting now if over)."""
    CACHE.set_limit(int(limit))


warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
