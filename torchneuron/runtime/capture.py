"""Whole-step graphs: a recorded segment replayed as one executable call (CUDA graphs on neuron).

Capturing records the ops of a block (or a function's call) exactly as fused eager records them
(runtime/deferred.py), and notes where each of the segment's inputs comes from, so that a replay
reads them afresh:

    ("storage", handle)   a storage's buffer at replay time (parameters, static inputs, state)
    ("arg", i)            the i-th tensor argument's storage (torchneuron.capture: bound per call)
    ("rng", device)       a new (seed, offset) of the device's generator: each replay draws anew
    ("word", device)      the device's failure word (device-side asserts)
    ("const", value)      a value fixed at capture (a Python scalar, a host copy made inside)

and which storages its live values go to. A host sync inside a capture (`item()`, a host copy, a
data-dependent op, a CPU fallback) raises, naming the op, as CUDA does. One replay is one call of
one executable; the storages written by the step are kept alive by the graph, as CUDA's graph keeps
its memory pool.
"""
from __future__ import annotations

import collections

import jax
import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import deferred, device_asserts, devices, executables, generators, storages

STATS = collections.Counter()  # captures, replays


def stats() -> dict:
    """Graphs captured, and replays of captured graphs."""
    return {"captures": STATS["captures"], "replays": STATS["replays"]}


CaptureError = deferred.CaptureError


class _Recording:
    """What a capture in progress knows: the storages' buffers when it began, the argument storages."""

    def __init__(self, arg_handles: dict[int, int]):
        self.previous = dict(storages.table())  # handle -> buffer when the capture began
        self.previous_words = dict(device_asserts.words())
        self.handle_of = {id(buf): handle for handle, buf in self.previous.items()}
        self.words = {id(w): index for index, w in self.previous_words.items()}
        self.arg_handles = arg_handles  # storage handle -> argument position
        self.sources: list = []  # per segment input, in order
        self.keep: list = []  # storages written inside: kept alive with the graph

    def source_of(self, value, rng_device) -> tuple:
        if rng_device is not None:
            return ("rng", rng_device)
        word = self.words.get(id(value))
        if word is not None:
            return ("word", word)
        handle = self.handle_of.get(id(value))
        if handle is None:
            return ("const", value)
        arg = self.arg_handles.get(handle)
        return ("arg", arg) if arg is not None else ("storage", handle)


class Graph:
    """A captured step: one executable, where its inputs come from and where its values go."""

    def __init__(self, program, inputs, sources, outputs, device, keep):
        self.program = program
        self.inputs = inputs  # the values at capture (consts are read from here)
        self.sources = sources
        self.outputs = outputs  # per program output: ("storage", handle) | ("arg", i) | ("word", d)
        self.device = device
        self.keep = keep
        # the program's inputs and outputs come grouped by kind (`_arranged`): each kind's block
        def where(places, kind):
            return [w for k, w in places if k == kind]
        self._read_storages, self._read_args = where(sources, "storage"), where(sources, "arg")
        self._read_rng, self._read_words = where(sources, "rng"), where(sources, "word")
        self._consts = [v for v, (k, _) in zip(inputs, sources) if k == "const"]
        self._written_storages, self._written_args = where(outputs, "storage"), where(outputs, "arg")
        self._written_words = where(outputs, "word")

    def replay(self, arg_handles: list[int] | None = None, fresh: dict | None = None) -> None:
        """Run the step on the storages' current buffers; bind its values. `arg_handles`: the
        storages of this call's tensor arguments; `fresh`: output position -> handle to bind
        instead (new result tensors)."""
        deferred.flush("graph replay")
        storages.drain()
        table = storages.table()
        values = [table[handle] for handle in self._read_storages]
        if self._read_args:
            values += [table[arg_handles[a]] for a in self._read_args]
        draw = []  # a random op's (seed, offset): its two "rng" inputs, in that order
        for device in self._read_rng:
            if not draw:
                draw = [np.uint64(v) for v in generators.next_seed_and_offset(torch.device("neuron", device), None)]
            values.append(draw.pop(0))
        values += [device_asserts.word(device) for device in self._read_words]
        results = self.program(*values, *self._consts)
        handles = self._written_storages
        if fresh:  # (a fresh result goes to its new tensor instead: always a storage output)
            handles = list(handles)
            for i, handle in fresh.items():
                handles[i] = handle
        storages.bind_each(handles, results)
        at = len(handles)
        for a in self._written_args:
            storages.bind(arg_handles[a], results[at])
            at += 1
        for device in self._written_words:
            device_asserts.update(device, results[at])
            at += 1
        STATS["replays"] += 1


def begin(arg_handles: dict[int, int] | None = None) -> None:
    """Start recording a graph (fused eager's pending work runs first)."""
    if deferred.capturing():
        raise CaptureError("neuron: a graph capture is already in progress")
    deferred.flush("graph capture")
    storages.drain()
    deferred.start_capture(_Recording(arg_handles or {}))


def abort() -> None:
    """Drop a capture that failed: every storage keeps the value it had before it."""
    if deferred.capturing():
        recording, segment = deferred.stop_capture()
        _restore(recording, segment, storages.table())


def end(execute: bool, keep_storages: list) -> Graph | None:
    """Finish recording: the Graph. With `execute` the recorded step also runs now (its values
    bound, as if run eagerly); without it (CUDA's capture) every storage keeps the value it had
    before the capture until the first replay. None if nothing was recorded."""
    recording, segment = deferred.stop_capture()
    survivors = _survivors(recording.keep)
    table = storages.table()
    for i, (kind, where) in enumerate(recording.sources):
        if kind == "storage" and where not in table:  # read, then gone: nothing can change its value now
            recording.sources[i] = ("const", None)
    bound = {}  # (node, out) -> ("storage", handle) | ("arg", i): where the live values go
    for handle, buf in table.items():
        if type(buf) is deferred.Pending and buf.segment is segment:
            arg = recording.arg_handles.get(handle)
            bound.setdefault((buf.node, buf.out), []).append(("arg", arg) if arg is not None else ("storage", handle))
    for index, word in device_asserts.words().items():
        if type(word) is deferred.Pending and word.segment is segment:
            bound.setdefault((word.node, word.out), []).append(("word", index))
    if not segment.nodes:
        return None
    live, outputs = [], []
    for (node, out), places in sorted(bound.items()):
        for place in places:
            live.append((node, out))
            outputs.append(place)
    # by kind (storages first): a replay binds each kind's block in one pass
    order = sorted(range(len(outputs)), key=lambda j: _WRITTEN_KINDS.index(outputs[j][0]))
    live, outputs = [live[j] for j in order], [outputs[j] for j in order]
    body, inputs, sources, fixed = _arranged(deferred.composed(segment.nodes, live), segment.inputs,
                                             recording.sources)
    program = executables.Function(body, "graph", f"graph of {len(segment.nodes)} ops",
                                   identity=_identity(segment.nodes, live, sources, fixed),
                                   device=devices.jax_device(segment.device))
    # its plans' checks, whose traces it reuses (their messages are stored with it)
    program.messages = set().union(*(function.messages for function, _ in segment.nodes))
    graph = Graph(program, inputs, sources, outputs, segment.device, keep_storages + survivors)
    STATS["captures"] += 1
    if execute:
        results = program(*inputs)
        _bind_results(graph, results, recording.arg_handles)
    else:
        _restore(recording, segment, table)
    return graph


_READ_KINDS = ("storage", "arg", "rng", "word", "const")
_WRITTEN_KINDS = ("storage", "arg", "word")


def _arranged(body, inputs: list, sources: list):
    """The program with its inputs grouped by source kind, in `_READ_KINDS` order, so that a replay
    gathers each kind's block in one pass; and with its host constants (Python scalars:
    hyperparameters, `x * 0.5`) built into it rather than passed at every replay, so that XLA folds
    what depends only on them (the AdamW step's bias corrections and step sizes, per parameter).
    Returns (program, its inputs, their sources, the constants built in by input position)."""
    fixed = {i: value for i, (value, (kind, _)) in enumerate(zip(inputs, sources))
             if kind == "const" and not isinstance(value, jax.Array)}
    order = sorted((i for i in range(len(inputs)) if i not in fixed), key=lambda i: _READ_KINDS.index(sources[i][0]))
    n = len(inputs)

    def program(*given):
        full = [fixed.get(i) for i in range(n)]
        for i, value in zip(order, given):
            full[i] = value
        return body(*full)

    return program, [inputs[i] for i in order], [sources[i] for i in order], fixed


# Constants whose repr names them exactly (a graph's persistent name spells its built-in constants)
_NAMED_CONSTANTS = (bool, int, float, complex, str, type(None), np.generic)
_NAMED_ARRAY_BYTES = 4096  # (host arrays built in: a view's sizes and strides; larger ones stay unnamed)


def _constant_name(value) -> str | None:
    if isinstance(value, _NAMED_CONSTANTS):
        return repr(value)
    if isinstance(value, np.ndarray) and value.nbytes <= _NAMED_ARRAY_BYTES:
        return repr((str(value.dtype), value.shape, value.tobytes().hex()))
    return None


def _identity(nodes, live, sources, fixed) -> str | None:
    """The graph's persistent name, as a segment's (runtime/deferred.py): its plans' names and
    wiring, the values it hands out, where its inputs come from and its built-in constants; None
    if a plan has no name or a constant no exact one. With it a later process loads the graph's
    executable from the persistent cache without tracing it."""
    names = [function.identity for function, _ in nodes]
    constants = sorted((i, _constant_name(v)) for i, v in fixed.items())
    if any(name is None for name in names) or any(name is None for _, name in constants):
        return None
    return repr(("graph", tuple(zip(names, (refs for _, refs in nodes))), tuple(live),
                 tuple(kind for kind, _ in sources), tuple(constants)))


def _survivors(kept: list) -> list:
    """Of the storages written inside the capture (held so that no handle is reused while it
    records), those that something besides the capture still uses. The rest are the step's
    intermediates: they die here, so their values stay inside the graph's program instead of
    becoming outputs it must write every replay (the GPT step: 304 outputs, 70 without them)."""
    weak = [StorageWeakRef(s) for s in kept]
    kept.clear()
    storages.drain()  # (the allocator queues frees for us to apply)
    return [torch.UntypedStorage._new_with_weak_ptr(w.cdata) for w in weak if not w.expired()]


def _bind_results(graph, results, arg_handles) -> None:
    by_position = {i: h for h, i in arg_handles.items()}
    for (kind, where), value in zip(graph.outputs, results):
        if kind == "storage":
            storages.bind(where, value)
        elif kind == "arg":
            storages.bind(by_position[where], value)
        else:
            device_asserts.update(where, value)


def _restore(recording, segment, table) -> None:
    """CUDA's capture runs nothing: storages written inside get back their buffers from before;
    those made inside are zeros until the first replay."""
    for handle, buf in list(table.items()):
        if type(buf) is deferred.Pending and buf.segment is segment:
            old = recording.previous.get(handle)
            storages.bind(handle, old if old is not None else storages.zeros(buf.shape[0], buf.dtype, segment.device))
    for index, word in device_asserts.words().items():
        if type(word) is deferred.Pending and word.segment is segment:
            device_asserts.set_word(index, recording.previous_words.get(index))
