"""Deferred execution: a storage's buffer may be a pending value of a recorded segment.

In fused eager mode (`TORCHNEURON_EAGER=fused`, `torchneuron.eager_mode("fused")`) the eager driver
still plans every call (meta kernels run at the call, so shape, dtype and argument errors are raised
where the user made them) but, instead of calling the plan's executable, records it here:

    outputs = deferred.record(function, flat)   # Pending values, bound to storages like buffers

A flush turns the recorded segment into one jitted program, the plans' own bodies composed over the
segment's inputs, and replaces every pending value still referenced by its computed array. Only
values something still refers to (a live storage, the failure word) become outputs: a storage
overwritten or freed inside the segment stays inside XLA's program.

Segments are cached by their structure: each node's plan function (whose identity covers op,
shapes, dtypes and layouts) and where its inputs come from (the segment's n-th input, or node j's
k-th output), plus which outputs are live. Never addresses: a training loop reaches a steady state
of a few cached segments. A segment is flushed when something needs a value (a host copy, `item()`,
a data-dependent op, a compiled graph's call, synchronize, a mode switch), or when it grows long
(past CUT_AFTER, before an op that reads no pending value; at MAX_NODES in any case);
`torchneuron.eager_stats()` counts segments and flush reasons, and `TORCHNEURON_LOG=flushes` prints
every flush's reason.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import sys
import threading
import time

import jax
import numpy as np

from .. import config
from . import assert_messages, compilation_cache, devices, executables, tables
from .dtypes import HOST_SCALAR_IDENTS, PYTHON_SCALAR_TYPES

# A bounded segment: a longer one is flushed (what a pending segment holds alive stays bounded,
# and its program compiles in bounded time).
MAX_NODES = 1024
# Past this length a segment is cut before the next op that reads no pending value (a loop's first
# op on its starting tensor, a step's first op on parameters and data): cuts then fall where the
# program's own structure puts them, so a loop that never synchronizes repeats a few segment
# structures. Cut only at MAX_NODES, a loop of 1,000 ops would start each segment at another
# phase of its body, every segment a new structure and a new compile.
CUT_AFTER = MAX_NODES // 2


class CaptureError(RuntimeError):
    """An operation that needs a value from the device ran inside a graph capture."""


# Who holds pending values registers here (storages, device_asserts): deferred imports none of them.
BEFORE_FLUSH: list = []  # run before a flush: apply queued storage frees (their values die inside)
AFTER_FLUSH: list = []  # run after a flush: replace computed Pending values by their arrays


class Pending:
    """A value of the current segment that has not been computed yet: node `node`'s output `out`.
    Has the array's shape and dtype (`aval`: the pair); `value` is the array once its segment ran."""

    __slots__ = ("aval", "dtype", "node", "out", "segment", "shape", "value")

    def __init__(self, segment, node: int, out: int, aval: tuple):
        self.segment = segment
        self.node = node
        self.out = out
        self.aval = aval
        self.shape, self.dtype = aval
        self.value = None

    def __repr__(self):
        return f"Pending(node {self.node}[{self.out}], {self.shape}, {self.dtype})"


class Segment:
    __slots__ = ("device", "input_avals", "input_index", "inputs", "nodes", "outputs", "reach")

    def __init__(self):
        self.device = None  # the NeuronCore its plans run on
        self.reach = 0  # the largest growing size its bucketed calls met (record's `reach`)
        self.nodes: list = []  # (function, input refs): with the live outputs, the cache key
        self.inputs: list = []  # concrete arrays and host scalars the segment reads
        self.input_avals: list = []  # their (shape, dtype): read once per segment (jax.Array's are Python properties)
        self.input_index: dict = {}  # id(input), or a host scalar's (dtype, bytes) -> its position
        self.outputs: list = []  # per node: its Pending outputs


_mode = {"fused": config.EAGER == "fused"}
_segment = Segment()
_lock = threading.RLock()
# structure -> executables.Function; it goes when the cache evicts its program, or past the limit
# (where the cache still holds its executables until their turn to be evicted)
_SEGMENTS = tables.BoundedTable("fused segments", 4096)
STATS = collections.Counter()  # ops, segments, segment_compiles, and flush reasons ("flush:<reason>")


_capture = {"recording": None, "was_fused": False}  # the capture in progress (runtime/capture.py)


def capturing() -> bool:
    return _capture["recording"] is not None


def start_capture(recording) -> None:
    """Record into a fresh segment for a graph capture: no flush may run until stop_capture."""
    global _segment
    _segment = Segment()
    _capture["recording"], _capture["was_fused"] = recording, _mode["fused"]
    _mode["fused"] = True


def stop_capture():
    """(the capture's recording, its segment); recording goes back to what it was."""
    global _segment
    recording, segment = _capture["recording"], _segment
    STATS["ops"] += len(segment.nodes)
    _capture["recording"] = None
    _mode["fused"] = _capture["was_fused"]
    _segment = Segment()
    return recording, segment


def note_storage_buffer(handle: int, buf) -> None:
    """A storage materialised its buffer (zeros): a capture in progress reads it as that storage's."""
    recording = _capture["recording"]
    if recording is not None:
        recording.handle_of[id(buf)] = handle
        recording.previous.setdefault(handle, buf)


def keep(storage) -> None:
    """A storage the capture in progress writes: kept alive with its graph."""
    recording = _capture["recording"]
    if recording is not None:
        recording.keep.append(storage)


def has_pending() -> bool:
    return bool(_segment.nodes)


def set_fused(on: bool, reason: str = "mode switch") -> None:
    if not on and _mode["fused"]:
        flush(reason)
    _mode["fused"] = on


@contextlib.contextmanager
def fused(on: bool):
    """Fused (on) or strict eager inside the block; flushes when leaving fused execution."""
    previous = _mode["fused"]
    set_fused(on)
    try:
        yield
    finally:
        set_fused(previous)


def _out_avals(function, signature: tuple) -> list:
    """Shapes and dtypes of `function`'s outputs for inputs of `signature` ((shape, dtype) each):
    traced once each, or read from the persistent cache for a named function (a warm process traces
    no plan at all). Kept on the function: they go when the cache drops it."""
    found = function.out_avals.get(signature)
    if found is None:
        key = compilation_cache.output_avals_key(function.identity, signature) if function.identity else None
        found = compilation_cache.load_value(key) if key is not None else None
        if found is None:
            structs = [jax.ShapeDtypeStruct(*aval) for aval in signature]
            with assert_messages.collected() as messages:  # (a segment reuses this trace: see flush)
                out = jax.eval_shape(function.jitted, *structs)
            function.messages |= messages
            found = [(o.shape, o.dtype) for o in jax.tree_util.tree_leaves(out)]
            if key is not None:
                compilation_cache.store_value(key, found)
        function.out_avals[signature] = found
    return found


_HOST_SCALARS = frozenset(PYTHON_SCALAR_TYPES.values())
_CARRIES_DTYPE: dict = {}  # type -> whether its values have a dtype (arrays; not Python numbers)
_scalar_ident = HOST_SCALAR_IDENTS.get  # (a memoized host scalar's (dtype, bytes), read once)


def record(function, flat, device_index: int, rng_at: int = -1, reach: int = 0) -> list:
    """Record a call of `function` (an executables.Function) on `flat`, on NeuronCore
    `device_index`, in the current segment; returns its outputs as Pending values. `rng_at`: where
    the call's generator (seed, offset) pair starts in `flat` (a capture draws it anew per replay).
    `reach`: a bucketed call's largest growing size (its arguments' and results'), else 0.
    (Every eager op of fused execution comes here: a call on the segment's core, short of a cut
    and not bucketed, checks no cut rule.)"""
    with _lock:
        segment = _segment
        if reach or segment.device != device_index or len(segment.nodes) >= CUT_AFTER:
            segment = _segment_to_record_in(flat, device_index, reach)
        recording = _capture["recording"]
        refs, signature = [], []
        input_index, input_avals = segment.input_index, segment.input_avals
        for position, a in enumerate(flat):
            kind = type(a)
            if kind is Pending:
                if a.value is None and a.segment is segment:
                    refs.append((a.node, a.out))
                    signature.append(a.aval)
                    continue
                a = concrete(a)  # (computed already: its array)
                kind = type(a)
            # a Python number is a new numpy scalar per call: equal ones (bit for bit) are one
            # input of the segment (`x * 1.001 + 0.001` in a loop: two inputs, not two per step)
            if kind in _HOST_SCALARS:
                ident = _scalar_ident(id(a)) or (a.dtype, a.tobytes())
            elif _CARRIES_DTYPE.get(kind) or _CARRIES_DTYPE.setdefault(kind, hasattr(a, "dtype")):
                ident = id(a)
            else:
                a = np.asarray(a)
                ident = (a.dtype, a.tobytes()) if type(a) in _HOST_SCALARS else id(a)
            k = input_index.get(ident)
            if k is None:
                k = _add_input(segment, a, ident)
                if recording is not None:  # (a capture draws the generator's pair anew per replay)
                    random = 0 <= rng_at <= position < rng_at + 2
                    recording.sources.append(recording.source_of(a, device_index if random else None))
            refs.append(k)
            signature.append(input_avals[k])
        nodes = segment.nodes
        node = len(nodes)
        signature = tuple(signature)
        avals = function.out_avals.get(signature) or _out_avals(function, signature)
        nodes.append((function, tuple(refs)))
        if len(avals) == 1:  # (most ops: no comprehension's frame)
            outputs = [Pending(segment, node, 0, avals[0])]
        else:
            outputs = [Pending(segment, node, i, aval) for i, aval in enumerate(avals)]
        segment.outputs.append(outputs)
        if node + 1 >= MAX_NODES and recording is None:
            held = list(outputs)  # (the caller's values: referenced, so live in the flush)
            flush("segment length")
            return [p.value for p in held]
        return outputs


def _segment_to_record_in(flat, device_index: int, reach: int) -> Segment:
    """The segment a call on `device_index` records in, the current one cut first where it must be:
    another core's, past CUT_AFTER before a call that reads none of its values, or before a
    bucketed call whose size grew past the segment's."""
    segment = _segment
    if segment.device != device_index:
        if segment.nodes:  # one program runs on one core
            flush("another core")
            segment = _segment
        segment.device = device_index
    elif len(segment.nodes) >= CUT_AFTER and _capture["recording"] is None and _reads_nothing_pending(
            flat, segment):
        flush("segment length")
        segment = _segment
        segment.device = device_index
    elif reach > segment.reach > 0 and _capture["recording"] is None:
        # A size that grows past every one the segment met so far (a decode step's token ids,
        # one position ahead of its caches): cut before it, every step alike, so the step
        # whose ids enter the next bucket before its caches do records the two halves of the
        # steady steps on either side (one bucket's, the next's), not a segment of its own.
        flush("a size grew")
        segment = _segment
        segment.device = device_index
    if reach:
        segment.reach = max(segment.reach, reach)
    return segment


def _add_input(segment: Segment, a, ident) -> int:
    k = segment.input_index[ident] = len(segment.inputs)
    segment.inputs.append(a)
    segment.input_avals.append((a.shape, a.dtype))
    return k


def _reads_nothing_pending(flat, segment) -> bool:
    for a in flat:
        if type(a) is Pending and a.value is None and a.segment is segment:
            return False
    return True


_getrefcount = sys.getrefcount


def _references(outs: list, k: int) -> int:
    return _getrefcount(outs[k])


# references to an object held only by a list, counted exactly as flush counts them (the same
# expression, `_getrefcount(outs[k])`): more means something besides the segment refers to it
_HELD_BY_LIST = _references([object()], 0)


def concrete(value, drain: bool = True):
    """`value` as an array: a Pending value's segment is flushed first (`drain` False: from inside
    the storages' own drain, which must not run again)."""
    if type(value) is not Pending:
        return value
    if value.value is None:
        flush("value needed", drain=drain)
    if value.value is None:  # (its segment ran, but this value was not live then)
        raise RuntimeError(f"neuron: internal error: {value!r} was read after its segment dropped it")
    return value.value


def concrete_all(values, reason: str) -> list:
    """`values` with every Pending value computed (one flush, if any is pending)."""
    if any(type(v) is Pending and v.value is None for v in values):
        flush(reason)
    return [v.value if type(v) is Pending else v for v in values]


def flush(reason: str = "flush", drain: bool = True) -> None:
    """Run the current segment (if it recorded anything) as one program and bind its live values."""
    global _segment
    with _lock:
        if not _segment.nodes:
            return
        if _capture["recording"] is not None:
            raise CaptureError(f"neuron: a graph capture cannot wait for the device ({reason}): values are "
                               f"not computed while capturing (move item(), host copies, printing and "
                               f"data-dependent ops out of the captured region)")
        if drain:  # freed storages' pending values die first, so they stay inside the program
            for hook in BEFORE_FLUSH:
                hook()
            if not _segment.nodes:  # (drain flushed it: a storage grew from a pending value)
                return
        segment, _segment = _segment, Segment()
        STATS["ops"] += len(segment.nodes)  # (counted here: one addition a segment, not one an op)
        STATS["segments"] += 1
        STATS[f"flush:{reason}"] += 1
        # live: a value something besides the segment refers to (a storage, a failure word, a caller)
        live = [(j, k, outs[k]) for j, outs in enumerate(segment.outputs) for k in range(len(outs))
                if _getrefcount(outs[k]) > _HELD_BY_LIST]
        segment.outputs = []
        STATS["values_out"] += len(live)
        key = (tuple(segment.nodes), tuple((j, k) for j, k, _ in live))
        program = _SEGMENTS.get(key)
        if program is None:
            STATS["segment_compiles"] += 1
            plans = {function for function, _ in segment.nodes}
            for function in plans:
                function.segments += 1
            program = executables.Function(
                composed(segment.nodes, [(j, k) for j, k, _ in live]), "segment", f"segment of {len(segment.nodes)}",
                identity=_identity(segment.nodes, live), device=devices.jax_device(segment.device))
            program.on_empty = functools.partial(_segment_evicted, key, program, plans)
            _SEGMENTS.add(key, program)
            # its plans' checks, whose traces it reuses (their messages are stored with it)
            program.messages = set().union(*(function.messages for function, _ in segment.nodes))
        started = time.perf_counter()
        new = not program.signatures
        try:
            results = program(*segment.inputs)
        except Exception as e:
            raise _failed_node(segment, e) from e
        for (_, _, p), value in zip(live, results):
            p.value = value
        _rebind()
        if "flushes" in config.LOG:
            print(f"[torchneuron] flush ({reason}): {len(segment.nodes)} ops, {len(live)} live values, "
                  f"{'new program' if new else 'cached program'}, {1e3 * (time.perf_counter() - started):.1f} ms",
                  file=sys.stderr)


def _segment_evicted(key, program, plans) -> None:
    """The cache dropped a segment's program. A plan function that only ran inside segments has no
    executable of its own for the cache to evict: it goes (with the plan that holds it) once no
    cached segment holds it, or fused eager would keep a plan per shape forever."""
    _SEGMENTS.discard(key, program)  # (not one made in its place after the table's limit dropped it)
    for function in plans:
        function.segments -= 1
        if not function.segments and not function.signatures and function.on_empty is not None:
            function.on_empty()


def _rebind() -> None:
    """Holders of computed Pending values (storages, failure words) take the arrays themselves."""
    for hook in AFTER_FLUSH:
        hook()


def composed(nodes, live):
    """The segment as one function of its inputs: each node's plan body on its inputs' values."""
    def program(*inputs):
        values = []
        for function, refs in nodes:
            args = [inputs[r] if type(r) is int else values[r[0]][r[1]] for r in refs]
            out = function.jitted(*args)
            values.append(list(out) if isinstance(out, (tuple, list)) else [out])
        return [values[j][k] for j, k in live]
    return program


def _identity(nodes, live) -> str | None:
    """The segment's persistent name: its plans' names and its wiring (None if a plan has no name)."""
    names = [function.identity for function, _ in nodes]
    if any(name is None for name in names):
        return None
    return repr(("segment", tuple(zip(names, (refs for _, refs in nodes))), tuple((j, k) for j, k, _ in live)))


def _failed_node(segment, error: Exception) -> Exception:
    """Run the segment op by op to name the op that failed."""
    values = []
    for function, refs in segment.nodes:
        args = [segment.inputs[r] if type(r) is int else values[r[0]][r[1]] for r in refs]
        try:
            out = function.jitted(*args)
        except Exception as e:  # noqa: BLE001
            return type(e)(f"neuron: {function.name} failed in a fused segment: {e}")
        values.append(list(out) if isinstance(out, (tuple, list)) else [out])
    return error


def stats() -> dict:
    """Fused eager's counters: ops recorded, segments run, segments compiled (the rest were cache
    hits), values the segments handed out (the rest stayed inside their programs), cached segment
    programs, and the number of flushes per reason."""
    with _lock:
        flushes = {k.split(":", 1)[1]: v for k, v in STATS.items() if k.startswith("flush:")}
        return {"mode": "fused" if _mode["fused"] else "strict", "ops": STATS["ops"] + len(_segment.nodes),
                "segments": STATS["segments"], "segment_compiles": STATS["segment_compiles"],
                "segment_hits": STATS["segments"] - STATS["segment_compiles"],
                "values_out": STATS["values_out"], "cached_segments": len(_SEGMENTS),
                "pending_ops": len(_segment.nodes), "flushes": flushes}

