"""Runs one ATen call on neuron: describe the call, find (or build) its plan, execute it.

    describe.py   the call's tensors, scalars and storages, and its plan key
    plan.py       a plan, built once per key from the op's meta kernel
    execute.py    a plan's jit-compiled call over the storages' buffers

`run` is every eager kernel's entry. The common call (positional tensors on one device, every
storage written, a plan already built) is described, keyed and executed in one pass; every
other call is described in full. An op hook (the profiler's) can observe each call.
"""
from __future__ import annotations

import functools
import threading

import torch

from .. import config
from ..runtime import executables, storages, tables
from ..runtime.core import urgent
from ..runtime.dtypes import UnsupportedDtypeError, host_scalar
from . import buckets, overlap, recompiles
from .describe import (
    NO_DEVICE,
    CallDescription,
    buffers_of,
    describe,
    key_of,
    move_host_operands,
    plan_key,
    shared_offsets,
    tensor_key,
)
from .plan import Plan
from .schema import Kind, OpSchema, parse

_lock = threading.RLock()
_lookup = storages.lookup
# op -> {plan key -> Plan}: the plans of every op, whichever kernel runs it. Plain dicts, read by
# each call; their total is bounded by _BUILT, which knows the order the plans were built in.
PLANS: dict = {}
# (a plan holds about 30 KB of host memory, measured over 2,000 plans of `x[:n].add_(1)`, which
# share three programs: no executable eviction ever dropped them)
PLAN_LIMIT = 4096


def _forget_plan(op_and_key, plans) -> None:
    """(_BUILT's limit) a plan built long ago goes: built again at its next call, if any."""
    plan = plans.pop(op_and_key[1], None)
    if plan is not None and plan.function is not None:
        executables.forget_when_empty(plan.function, op_and_key)


_BUILT = tables.BoundedTable("eager plans", PLAN_LIMIT, on_drop=_forget_plan)  # (op, plan key) -> its op's plans
# (reported as the plans held: _BUILT also keeps keys whose plans went with their programs)
tables.register("eager plans", lambda: sum(map(len, list(PLANS.values()))), PLAN_LIMIT)


def plans_of(op) -> dict:
    plans = PLANS.get(op)
    if plans is None:
        plans = PLANS[op] = {}
    return plans


# The op hook: None, or (active, hook). While active() is true every call goes to
# hook(schema, plans, args, kwargs, run), which must call run(schema, plans, args, kwargs).
_hook = None


def set_op_hook(active, hook) -> None:
    """Have `hook` observe every call while `active()` says so (the profiler's ranges)."""
    global _hook
    _hook = (active, hook)


def is_planned(schema: OpSchema, plans: dict, args, kwargs) -> bool:
    """Whether this call finds a plan already built (a hook names compiling calls)."""
    args, kwargs = move_host_operands(schema, args, kwargs)
    return key_of(schema, describe(schema, args, kwargs)) in plans


def run(schema: OpSchema, plans: dict, args, kwargs):
    """Every eager op's entry: the common call takes the one-pass path, the rest are described."""
    if _hook is not None and _hook[0]():
        return _hook[1](schema, plans, args, kwargs, _run_described)
    if urgent.value:  # storages.maybe_drain, without the call
        storages.drain()
    result = _run_in_one_pass(schema, plans, args, kwargs)
    if result is not None:
        return result
    return _run_described(schema, plans, args, kwargs)


def run_op(op, *args, **kwargs):
    """Run `op` through the eager driver, bypassing the dispatcher."""
    return run(parse(op), plans_of(op), args, kwargs)


def _run_in_one_pass(schema: OpSchema, plans: dict, args, kwargs):
    """The common call in one pass: positional arguments, Python scalars and absent optional
    tensors among the leading operands (0-dim CPU tensors among them: scalars too), static
    arguments (dims, sizes, flags) and absent optional ones after them and among the keyword
    arguments (gelu's `approximate`, attention's `scale`), tensors on one neuron device, every
    storage already written. Returns None, having run nothing, for any other call or a call
    without a plan yet: `describe` handles those (and raises their errors), and keys a call as
    this pass does. A call without tensors (a factory: `arange`, `full`, its device a keyword)
    takes it when its plan is the simple kind."""
    keyed = _key_in_one_pass(schema, args, kwargs)
    if keyed is None:
        return None
    entries, handles, found, index, scalars, not_only_tensors = keyed
    plan = plans.get(plan_key(schema, entries, index, scalars))
    if plan is None or (index == NO_DEVICE and not plan.simple):
        return None
    if plan.simple:
        for v in scalars:  # (a loop: a comprehension's frame costs more than one or two appends)
            found.append(host_scalar(v))
        return plan.run_buffers(found)
    desc = CallDescription(schema.math_bits)
    desc.key, desc.handles, desc.buffers, desc.index = entries, handles, found, index
    desc.tensors = [t for t in args if isinstance(t, torch.Tensor) and t.get_device() >= 0] \
        if not_only_tensors else args
    desc.scalars = list(scalars)
    for n, handle in enumerate(handles):
        if handle:
            desc.sharing.setdefault(handle, n)
    return plan.execute(args, kwargs, desc)


def _key_in_one_pass(schema: OpSchema, args, kwargs):
    """The call's key entries as `describe` makes them, with its storages' handles and buffers, its
    device index, its scalars and whether an argument is other than a neuron tensor; None where
    `describe` must take the call."""
    entries, handles, found = [], [], []
    shared = not_only_tensors = host_tensors = False
    scalars = ()
    index = NO_DEVICE
    bits = schema.math_bits
    for position, t in enumerate(args):
        if not isinstance(t, torch.Tensor):  # (parameters included)
            scalar = _key_host_argument(schema, position, t, entries)
            if scalar is _REFUSED:
                return None
            if scalar is not None:
                scalars = [*scalars, scalar]
            not_only_tensors = True
            continue
        i = t.get_device()
        if i != index:
            if i < 0:
                # as `describe` takes it: a 0-dim CPU tensor the op reads is a traced scalar
                if t.dim() or t.device.type != "cpu" or position in schema.written:
                    return None
                host_tensors = not_only_tensors = True
                entries.append(("cpu", t.dtype))
                scalars = [*scalars, t.item()]
                continue
            if index != NO_DEVICE:
                return None
            index = i
        handle = t.untyped_storage().data_ptr()
        n = len(handles)
        # a few tensors: a scan finds a shared storage sooner than a dict is built
        first = handles.index(handle) if handle and handle in handles else n
        shared = shared or first != n
        handles.append(handle)
        if first == n:
            buf = _lookup(handle)
            if buf is None:
                return None
            found.append(buf)
        entries.append(tensor_key(t, first, bits))
    if index == NO_DEVICE and (host_tensors or not kwargs):
        return None  # (no neuron tensor: only a factory, whose device is a keyword, takes this path)
    if kwargs and not _key_keywords(schema, kwargs, entries):
        return None
    if shared:
        entries.append(shared_offsets(t for t in args if isinstance(t, torch.Tensor) and t.get_device() >= 0))
    return entries, handles, found, index, scalars, not_only_tensors


_REFUSED = object()


def _key_host_argument(schema: OpSchema, position: int, t, entries: list):
    """Append the key entry of a non-tensor argument as `describe` keys it; returns the scalar the
    program takes for it, None where it takes none, _REFUSED where `describe` must take the call."""
    kind = type(t)
    if position >= schema.leading_operands:
        arg_kind = schema.kinds[position]
        if arg_kind is Kind.STATIC:
            entries.append(tuple(t) if kind is list else t)
        elif t is None and (arg_kind is Kind.TENSOR or arg_kind is Kind.SCALAR):
            entries.append(None)
        elif arg_kind is Kind.SCALAR and (kind is float or kind is int or kind is bool):
            entries.append(kind)  # (`full`'s fill value, after its size)
            return t
        else:
            return _REFUSED
        return None
    if t is None:  # an absent optional operand (attention's mask, nll_loss's weight)
        entries.append(None)
        return None
    if kind is not float and kind is not int and kind is not bool:
        return _REFUSED
    # a Python scalar (`x * 1.001`, `x.pow(2)`)
    entries.append(kind if position in schema.scalar_args else ("py", kind))
    return t


def _key_keywords(schema: OpSchema, kwargs: dict, entries: list) -> bool:
    """Append the keyword arguments' entries after the positional ones, name then value, as `describe`
    keys them; False where `describe` must take the call."""
    kinds = schema.kind_by_name
    for name, value in kwargs.items():
        arg_kind = kinds[name]
        if arg_kind is Kind.STATIC:
            entries.append(name)
            entries.append(tuple(value) if type(value) is list else value)
        elif value is None and (arg_kind is Kind.TENSOR or arg_kind is Kind.SCALAR):
            entries.append(name)
            entries.append(None)
        else:
            return False
    return True


def _run_described(schema: OpSchema, plans: dict, args, kwargs, resized: bool = False):
    if urgent.value:
        storages.drain()
    args, kwargs = move_host_operands(schema, args, kwargs)
    desc = describe(schema, args, kwargs)
    key = key_of(schema, desc)
    plan = plans.get(key)
    if plan is None:
        if desc.shared and not schema.return_aliases and _writes_across_indices(schema, args):
            return _run_index_by_index(schema, plans, args, kwargs)
        result = buckets.run(schema, args, kwargs, desc)  # a growing size: its bucket's program
        if result is not buckets.NOT_BUCKETED:
            return result
        with _lock:
            try:
                plan = Plan(schema, args, kwargs, desc, buffers_of(desc, run=True))
            except UnsupportedDtypeError as e:
                raise UnsupportedDtypeError(e.dtype, str(schema.op)) from None
        if plan.resize:
            if resized:  # an out= tensor that is also an input: each resize changes the result again
                raise RuntimeError(overlap.PARTIAL)
            # out= arguments of the wrong size: resize them as PyTorch does, then run again.
            plan.apply_resizes(args, kwargs)
            return _run_described(schema, plans, args, kwargs, True)  # (the resizes' growths drained first)
        plans[key] = plan
        _BUILT.add((schema.op, key), plans)
        if plan.function is not None:  # evicted from the executable cache: built again when called
            executables.when_empty(plan.function, functools.partial(plans.pop, key, None), (schema.op, key))
        if "recompiles" in config.LOG:
            recompiles.log_new_plan(schema, plans, key, desc)
    return plan.execute(args, kwargs, desc)


def _writes_across_indices(schema: OpSchema, args) -> bool:
    """Whether a foreach op writes a storage that another index of its lists also uses (the same
    tensor twice in the list it writes, or a view of it read at another index). CPU runs such a
    call index by index, each element's update reading those before it; one program computes every
    element from the values before the call."""
    lists = [(i, value) for i, value in enumerate(args) if schema.kinds[i] is Kind.TENSORS]
    written = [value for i, value in lists if i in schema.written]
    if not written or len({len(value) for _, value in lists}) > 1:  # (lists of other lengths: the meta kernel's error)
        return False
    indices: dict = {}  # storage handle -> the list indices using it (a storage without bytes: none)
    for _, value in lists:
        for j, t in enumerate(value):
            if isinstance(t, torch.Tensor) and (handle := t.untyped_storage().data_ptr()):
                indices.setdefault(handle, set()).add(j)
    return any(len(indices.get(t.untyped_storage().data_ptr(), ())) > 1
               for value in written for t in value if isinstance(t, torch.Tensor))


def _run_index_by_index(schema: OpSchema, plans: dict, args, kwargs) -> None:
    """A foreach op without results, run as one call per index of its lists, in order, as CPU runs it."""
    length = max(len(value) for i, value in enumerate(args) if schema.kinds[i] is Kind.TENSORS)
    per_index = [schema.kinds[i] is Kind.TENSORS or (schema.kinds[i] is Kind.SCALARS and isinstance(value, (list, tuple)))
                 for i, value in enumerate(args)]
    for j in range(length):
        run(schema, plans, tuple([value[j]] if listed else value for listed, value in zip(per_index, args)), kwargs)
