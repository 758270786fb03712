"""Graphs on neuron: CUDA's graph API (`torch.neuron.NeuronGraph`, `torch.neuron.graph`,
`torch.neuron.make_graphed_callables`) and `torchneuron.capture`, all on runtime/capture.py.

    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g):          # records, runs nothing (CUDA's semantics)
        static_loss = step(static_x, static_y)
    for x, y in data:
        static_x.copy_(x); static_y.copy_(y)
        g.replay()                       # one executable call: forward, backward, optimizer step

    step = torchneuron.capture(step)     # the convenience: tensor arguments bound per call
    loss = step(x, y)                    # 1st call of a signature: eager; 2nd: recorded; then replayed

As on CUDA: what the step reads besides its inputs (parameters, optimizer state) is read afresh at
each replay, Python in the step does not run again, random ops draw anew at each replay, and a host
sync inside a capture (`item()`, printing, a host copy, a data-dependent op) raises. No replay reuses
an optimizer's host numbers silently (capture_guards.py): a step of a `capturable=False` optimizer
inside a capture raises CUDA's error; `torchneuron.capture` makes the optimizers of its warm-up calls
capturable, and records again when a recorded optimizer's learning rate (or any other setting), or
the training mode of a module the step called, has changed since; a `NeuronGraph` refuses to replay
then. Other Python values the step reads (a number
in a closure) stay as captured.
"""
from __future__ import annotations

import functools
import warnings

import torch
from torch.utils import _pytree as pytree

from . import capture_guards
from .runtime import capture as _capture

CaptureError = _capture.CaptureError  # a device value needed inside a capture

__all__ = ["NeuronGraph", "capture", "graph", "make_graphed_callables"]
# What torch.neuron gains from this module (CUDA's names in torch.cuda).
DEVICE_API = ("NeuronGraph", "graph", "make_graphed_callables")


class NeuronGraph:
    """A recorded sequence of neuron ops, replayed with one executable call (torch.cuda.CUDAGraph)."""

    def __init__(self, keep_graph: bool = False):
        self._graph = None
        self._host_values = None

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        _capture.begin()
        capture_guards.watch()

    def capture_end(self) -> None:
        self._graph = _capture.end(execute=False, keep_storages=[])
        self._host_values = capture_guards.watched()

    def replay(self) -> None:
        if self._graph is None:
            raise RuntimeError("NeuronGraph.replay(): nothing was captured")
        changed = self._host_values.changed()
        if changed:
            raise RuntimeError(
                f"NeuronGraph.replay(): {changed} since the graph was captured, and a replay would use the "
                "captured value. Capture the graph again, or keep the value in a device tensor changed in place "
                "(lr=torch.tensor(1e-3, device='neuron') with capturable=True: schedulers fill it).")
        self._graph.replay()

    def reset(self) -> None:
        self._graph = None

    def pool(self):
        return None  # one memory space: graphs need no private pool


class graph:
    """`with torch.neuron.graph(g): ...` records the block into NeuronGraph `g` (torch.cuda.graph)."""

    def __init__(self, neuron_graph: NeuronGraph, pool=None, stream=None, capture_error_mode: str = "global"):
        self.neuron_graph = neuron_graph

    def __enter__(self):
        torch.neuron.synchronize()
        self.neuron_graph.capture_begin()

    def __exit__(self, kind, value, traceback):
        if kind is not None:
            _capture.abort()
            capture_guards.watched()
            return False
        self.neuron_graph.capture_end()
        return False


def _signature(args) -> tuple:
    """What a recorded graph depends on in its arguments: every tensor's layout, dtype, device and
    which arguments share a storage; every other value itself. (With the arguments' storages.)"""
    if type(args) is tuple and all(type(x) is torch.Tensor for x in args):  # the common call: no pytree
        leaves, spec = args, len(args)
    else:
        leaves, spec = pytree.tree_flatten(args)
    handles: dict[int, int] = {}
    key = [spec]
    storages_of = []
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor):
            storage = x.untyped_storage()
            handle = storage.data_ptr()
            storages_of.append(handle)
            shared = handles.setdefault(handle, i) if handle else i
            key.append((x.shape, x.stride(), x.storage_offset(), storage.nbytes(), x.dtype, x.device,
                        x.requires_grad, shared))
        else:
            key.append((type(x), x))
    return tuple(key), storages_of


class _Captured:
    """torchneuron.capture(fn): per argument signature, eager for the first `warmup` calls, recorded
    on the next, replayed after."""

    def __init__(self, fn, warmup: int = 1):
        self.fn = fn
        self.warmup = warmup
        self.graphs: dict = {}  # signature -> (graph, result template, fresh result positions) | None
        self.calls: dict = {}
        self.recordings = 0
        self.replays = 0
        self.warned = False
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        key, handles = _signature((args, kwargs) if kwargs else args)
        found = self.graphs.get(key)
        if found is not None:
            changed = found[-1].changed()
            if changed is None:
                return self._replay(found, handles)
            self._warn_recording_again(changed)
            return self._record(key, handles, args, kwargs)
        calls = self.calls[key] = self.calls.get(key, 0) + 1
        if calls <= self.warmup:  # warm-up: lazily made state (optimizer moments) exists after it
            with capture_guards.warming_up():  # and the optimizers keep their step counts on the device
                return self.fn(*args, **kwargs)
        return self._record(key, handles, args, kwargs)

    def _warn_recording_again(self, changed: str) -> None:
        if not self.warned:
            self.warned = True
            warnings.warn(f"torchneuron.capture({getattr(self.fn, '__name__', self.fn)!r}): {changed} since the "
                          "step was recorded: recording it again (a replay would have used the old value). Each new "
                          "value costs a recording; a learning rate kept in a device tensor "
                          "(lr=torch.tensor(1e-3, device='neuron'), capturable=True) replays without one.",
                          stacklevel=3)

    def _record(self, key, handles, args, kwargs):
        _capture.begin({h: i for i, h in reversed(list(enumerate(handles))) if h})
        capture_guards.watch()
        try:
            result = self.fn(*args, **kwargs)
        except BaseException:
            _capture.abort()
            capture_guards.watched()
            raise
        host_values = capture_guards.watched()
        leaves, spec = pytree.tree_flatten(result)
        results = [x for x in leaves if isinstance(x, torch.Tensor)]
        graph = _capture.end(execute=True, keep_storages=[t.untyped_storage() for t in results])
        self.recordings += 1
        if graph is None:
            return result
        fresh = {}  # leaf position -> output position: result tensors that own their storage, new at each replay
        again = {}  # leaf position -> an earlier position holding the same fresh tensor
        first = {}
        for n, t in enumerate(leaves):
            if id(t) in first:
                again[n] = first[id(t)]
            elif isinstance(t, torch.Tensor) and t.device.type == "neuron" and not t.storage_offset() \
                    and t.is_contiguous() and t.numel() * t.element_size() == t.untyped_storage().nbytes():
                place = ("storage", t.untyped_storage().data_ptr())
                if place in graph.outputs:
                    fresh[n] = graph.outputs.index(place)
                    first[id(t)] = n
        self.graphs[key] = (graph, leaves, spec, fresh, {n: m for n, m in again.items() if m in fresh}, host_values)
        return result

    def _replay(self, found, handles):
        graph, leaves, spec, fresh, again, _ = found
        out = list(leaves)
        bind = {}
        for n, position in fresh.items():
            out[n] = made = torch.empty_like(leaves[n], memory_format=torch.contiguous_format)
            bind[position] = made.data_ptr()
        for n, m in again.items():
            out[n] = out[m]
        graph.replay(handles, bind)
        self.replays += 1
        return pytree.tree_unflatten(out, spec)


def capture(fn, warmup: int = 1):
    """`fn`, recorded once per argument signature and replayed as one executable call after: tensor
    arguments are bound per call (no copies into static inputs), a new shape, dtype or device
    records a new graph. The first `warmup` calls of a signature run eagerly, so state that the step
    makes lazily (optimizer moments) exists when the next call records it, and the optimizers they
    step become `capturable=True` (step counts on the device; capture_guards.py); 0 records the first
    call (a step that makes no state of its own). A call after an optimizer's learning rate or other
    setting changed records again, with a warning the first time."""
    if warmup < 0:
        raise ValueError(f"capture: warmup must be 0 or more, not {warmup}")
    return _Captured(fn, warmup)


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3, allow_unused_input: bool = False,
                           pool=None):
    """torch.cuda.make_graphed_callables on neuron: each callable's forward and backward recorded
    as graphs from `sample_args`, replayed by the returned callable (inputs copied into the static
    inputs, as on CUDA). A call with other shapes, dtypes or devices than the samples raises."""
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    _check_graphable(callables, sample_args)
    graphed = []
    for fn, args in zip(callables, sample_args):
        replay = _graph_one(fn, tuple(args), num_warmup_iters, allow_unused_input)
        graphed.append(_as_module_forward(fn, replay) if isinstance(fn, torch.nn.Module) else replay)
    return graphed[0] if single else tuple(graphed)


def _check_graphable(callables, sample_args) -> None:
    """CUDA's rules for what make_graphed_callables may record: each would replay stale state."""
    if torch.is_autocast_enabled("neuron") and torch.is_autocast_cache_enabled():
        raise RuntimeError("make_graphed_callables does not support the autocast caching. Please set "
                           "`cache_enabled=False`.")
    for fn, args in zip(callables, sample_args):
        if isinstance(fn, torch.nn.Module):
            if fn._backward_hooks or fn._forward_hooks or fn._forward_pre_hooks:
                raise RuntimeError("Modules must not have hooks registered at the time they are passed. However, "
                                   "registering hooks on modules after passing them through "
                                   "make_graphed_callables is allowed.")
            if any(b.requires_grad for b in fn.buffers()):
                raise RuntimeError("In any :class:`~torch.nn.Module` passed to :func:`~make_graphed_callables`, "
                                   "only parameters may be trainable. All buffers must have "
                                   "``requires_grad=False``.")
        if not all(isinstance(a, torch.Tensor) for a in pytree.arg_tree_leaves(*args)):
            raise RuntimeError("In the beta API, sample_args for each callable must contain only Tensors. Other "
                               "types are not allowed.")


def _as_module_forward(module: torch.nn.Module, replay):
    """The module itself, its forward replaced (CUDA's contract): the graphs replay while the module
    is in the training mode they were recorded in, its own forward runs in the other."""
    recorded_in_training, forward = module.training, module.forward

    def graphed_forward(*args):
        return replay(*args) if module.training == recorded_in_training else forward(*args)

    module.forward = graphed_forward
    return module


def _graph_one(fn, static_inputs, warmup: int, allow_unused: bool):
    params = tuple(p for p in fn.parameters() if p.requires_grad) if isinstance(fn, torch.nn.Module) else ()
    differentiable = tuple(x for x in static_inputs if isinstance(x, torch.Tensor) and x.requires_grad) + params
    for _ in range(warmup):
        outputs = pytree.tree_leaves(fn(*static_inputs))
        grads = torch.autograd.grad([o for o in outputs if o.requires_grad], differentiable,
                                    grad_outputs=[torch.ones_like(o) for o in outputs if o.requires_grad],
                                    allow_unused=allow_unused)
        del outputs, grads
    forward_graph, backward_graph = NeuronGraph(), NeuronGraph()
    with graph(forward_graph):
        static_outputs = fn(*static_inputs)
    flat_outputs, output_spec = pytree.tree_flatten(static_outputs)
    needs_grad = [o for o in flat_outputs if isinstance(o, torch.Tensor) and o.requires_grad]
    static_grad_outputs = [torch.empty_like(o) for o in needs_grad]
    with graph(backward_graph):
        static_grads = torch.autograd.grad(needs_grad, differentiable, grad_outputs=static_grad_outputs,
                                           allow_unused=allow_unused)

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            for static, given in zip(static_inputs, inputs[:len(static_inputs)]):
                if isinstance(static, torch.Tensor):
                    if given.shape != static.shape or given.dtype != static.dtype or given.device != static.device:
                        raise RuntimeError(f"graphed callable: an input of shape {tuple(given.shape)}, {given.dtype} "
                                           f"on {given.device}, but it was captured for {tuple(static.shape)}, "
                                           f"{static.dtype} on {static.device}; capture another graph for it")
                    if given.data_ptr() != static.data_ptr():
                        static.copy_(given)
            forward_graph.replay()
            return tuple(o.detach() for o in flat_outputs)

        @staticmethod
        def backward(ctx, *grads):
            for static, given in zip(static_grad_outputs, grads):
                static.copy_(given)
            backward_graph.replay()
            grads_in = iter(static_grads)
            result = [next(grads_in).detach() if isinstance(x, torch.Tensor) and x.requires_grad else None
                      for x in static_inputs]
            return (*result, *[g.detach() if g is not None else None for g in grads_in])

    def graphed(*inputs):
        outputs = Graphed.apply(*inputs, *params)
        return pytree.tree_unflatten(list(outputs), output_spec)

    return graphed
