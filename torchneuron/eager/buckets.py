"""Eager ops at bucketed sizes: a growing axis compiles O(log n) executables per op, not n.

A dynamic KV cache grows by one position a step, so every op that touches it meets a new size
each step; run at exact sizes, each compiles a new executable (docs/SHAPES.md). Here an op whose
calls differ only by one growing size runs padded to that size's bucket (`padding.bucket`):

- **Which sizes grow.** Calls of one op with the same structure (ranks, dtypes, storage sharing,
  static arguments) form a family. Two calls tell which dimensions vary: they must vary together by
  the same amount, at most one per tensor (one size n, each such dimension n + c). From the third
  call that fits, calls run at n's bucket B, each varying dimension at B + c. Calls that do not fit
  run at exact sizes, and so do those of a stream whose size keeps going down as well as up among
  a few sizes (a training step's layers of several widths, `_Stream.oscillates`): a growing cache
  only starts again, once per `generate`, and batches of many lengths stay bucketed.
- **Buffers with room.** A tensor with a varying dimension must be contiguous at offset 0. The
  program reads it through its true sizes, traced (the strides of a (1, heads, n, d) cache depend
  on n), zero at padded positions, and writes each result laid out at its true sizes into a buffer
  of the padded size: the storage's buffer is longer than its bytes, and the next step reads it
  without a new executable. Contents past a storage's bytes are never read as values. The first
  step of a bucket reads the previous bucket's shorter buffer: it is widened to its bucket's room
  first (a small program per pair of lengths), so that step runs the bucket's one program too.
- **What stays exact.** The padding rules of `lowering/padding.py`, shared with compiled graphs,
  decide per op: position-wise ops run as they are, reductions and attention fill or mask padded
  positions, and an op whose rule forbids padding an axis that varies (or that has no rule) runs at
  exact sizes. `cat` along the varying axis places each operand at its true offset.

Only functional calls are bucketed (fresh results, no out= or in-place writes, no random draws,
no device-side checks, no storage shared between arguments), and never while a graph captures.
Fused eager records a bucketed call like any plan (the true sizes are a traced argument): a decode
step's segment then repeats within a bucket. On by default; `TORCHNEURON_EAGER_BUCKETS=0` turns it off.
"""
from __future__ import annotations

import collections
import functools
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .. import config
from ..lowering import calling, draws_random, padding, record_of, run_meta
from ..runtime import deferred, executables, storages, tables
from ..runtime.dtypes import host_scalar, to_jax
from ..runtime.layout import Layout, canonical_stride, contiguous_stride, read
from .describe import CallDescription, buffers_of, is_tensor_entry
from .execute import fill_template
from .plan import template_of
from .schema import OpSchema

aten = torch.ops.aten
NOT_BUCKETED = object()  # run() found no bucketed way: the caller runs the call at exact sizes
_MISSING = object()
# What meta kernels raise for arguments they refuse (PyTorch's checks, our overrides' asserts)
_META_ERRORS = (RuntimeError, ValueError, IndexError, TypeError, NotImplementedError, AssertionError)

# Calls of one exact signature served padded before it gets its own exact plan: a growing cache
# meets each size a few times per step (once per layer), a fixed-size loop meets its size forever.
EXACT_AFTER = 128
_SERVED_LIMIT = 8192  # (cleared past it: a count lost only delays a size's own plan)
_SERVED: dict = {}  # exact plan key -> calls served padded
tables.register("bucket calls served", _SERVED.__len__, _SERVED_LIMIT)
FAMILY_STREAMS = tables.BoundedTable("bucket families", 4096)  # family key -> its streams


def _forget_plan(key, plan) -> None:
    if isinstance(plan, BucketedPlan):
        executables.forget_when_empty(plan.function, key)


# bucket key -> BucketedPlan, or the reason the op refused to run padded
BUCKETED_PLANS = tables.BoundedTable("bucketed plans", 4096, on_drop=_forget_plan)
STATS = collections.Counter()  # calls, plans, refused


class _Stream:
    """One way a family's sizes vary: which of them grow together (mask), from which sizes (base),
    and the sizes of its latest call."""

    __slots__ = ("base", "calls", "drops", "epoch", "epochs", "last", "mask", "ref", "sizes")

    def __init__(self, sizes):
        self.base = self.last = sizes
        self.mask = None
        self.ref = -1
        self.calls = self.drops = 0  # calls that fit it, and those smaller than the call before
        self.sizes: set = set()  # its growing size's values, up to FEW_SIZES + 1 of them
        self.epoch = self.epochs = 0  # the fused segment of its latest call; segments it served in

    def oscillates(self) -> bool:
        """Whether it keeps going down as well as up among a few sizes: a loop over fixed sizes (a
        training step's layers of several widths), not a growing axis. A decode loop's cache grows
        for a whole `generate` and starts again once per call; a loop over batches of many lengths
        (padded per batch) meets more than a few sizes: both stay bucketed."""
        return len(self.sizes) <= FEW_SIZES and self.drops >= OSCILLATES_AFTER and \
            self.drops * DROP_RATE >= self.calls

    def stands_still(self) -> bool:
        """Whether it served one size only, in STILL_SEGMENTS fused segments: a fixed size that met
        others of its family (a training step's sum over one of its layers' widths, whose other
        widths run their own exact plans and never reach the stream), not a growing one. A decode
        step meets each size of its caches in one segment (two where it is cut), then the next."""
        return len(self.sizes) == 1 and self.epochs >= STILL_SEGMENTS


MAX_STREAMS = 8  # ways one family's sizes vary at once (a cache's keys and values, layers of two widths)
# A stream that met at most FEW_SIZES sizes and went down OSCILLATES_AFTER times, at least once in
# DROP_RATE calls, is a loop over fixed sizes: its calls run at exact sizes (their own plans, no
# padding, no segment cuts).
OSCILLATES_AFTER = 4
DROP_RATE = 8
FEW_SIZES = 4
# A stream that served a single size in this many fused segments stands still: its calls run at
# exact sizes (in strict eager, segments do not advance, and EXACT_AFTER decides).
STILL_SEGMENTS = 4


def _structure(desc: CallDescription):
    """(family key, every tensor's sizes in one tuple, per tensor: may it vary), or None where the
    call cannot be bucketed (a CPU scalar tensor, a shared storage, a conj/neg view)."""
    family, sizes, may_vary = [], [], []
    tensors = desc.tensors
    i = 0
    for entry in desc.key:
        if is_tensor_entry(entry):
            shape, _stride, offset, dtype, first, conj, neg = entry
            if first != i or conj or neg:
                return None
            t = tensors[i]
            i += 1
            dense = offset == 0 and t.is_contiguous()
            family.append((len(shape), dtype, dense))
            sizes.extend(shape)
            may_vary.append(dense)
        elif type(entry) is tuple and entry and entry[0] == "cpu":
            return None
        else:
            family.append(entry)
    return tuple(family), tuple(sizes), may_vary


def _fits(stream: _Stream, sizes) -> bool:
    """Whether `sizes` are the stream's base with every varying size moved by the same amount."""
    base, mask = stream.base, stream.mask
    delta = sizes[stream.ref] - base[stream.ref]
    return all(size == first + (delta if varies else 0) for size, first, varies in zip(sizes, base, mask))


def _changes(a, b) -> int:
    return sum(x != y for x, y in zip(a, b))


def _learn(stream: _Stream, sizes, owners, may_vary) -> bool:
    """Learn the varying sizes from the stream's latest call and this one: those that changed, by
    one amount, at most one in each tensor, each in a tensor that may vary. False where they did
    not change that way."""
    diffs = [a - b for a, b in zip(sizes, stream.last)]
    changed = [d for d in diffs if d]
    owners_changed = [owners[k] for k, d in enumerate(diffs) if d]
    if not changed or any(d != changed[0] for d in changed) or len(set(owners_changed)) < len(owners_changed) or any(
            not may_vary[i] for i in owners_changed):
        return False
    stream.base, stream.mask = stream.last, tuple(bool(d) for d in diffs)
    stream.ref = stream.mask.index(True)
    return True


def _stream_for(streams: list, sizes, owners, may_vary) -> _Stream | None:
    """The stream whose growth `sizes` continue, or None. A call that fits no stream teaches the
    one whose latest sizes are nearest (or starts a new one) and runs at exact sizes: a stream
    serves calls from its third size on, so two calls that differ by chance (two models' head
    counts) never make one."""
    for stream in streams:
        if stream.mask is not None and _fits(stream, sizes):
            size = sizes[stream.ref]
            stream.calls += 1
            stream.drops += size < stream.last[stream.ref]
            if len(stream.sizes) <= FEW_SIZES:
                stream.sizes.add(size)
            epoch = deferred.STATS["segments"]
            if epoch != stream.epoch:
                stream.epoch = epoch
                stream.epochs += 1
            stream.last = sizes
            return stream
    nearest = min(streams, key=lambda st: _changes(st.last, sizes))
    if _learn(nearest, sizes, owners, may_vary):
        nearest.last = sizes
        return None
    if len(streams) >= MAX_STREAMS:
        streams.pop(0)
    streams.append(_Stream(sizes))
    return None


def _padded_sizes(stream: _Stream, sizes):
    """The sizes a call of `stream` runs at: the largest varying size at its bucket, every other
    varying one at its own distance from it (so the largest operand's buffer is read at the size
    it was padded to when written); None where a varying size is below 2 (a size of 1 or 0 would
    broadcast or vanish differently when padded)."""
    base, mask, ref = stream.base, stream.mask, stream.ref
    if any(varies and size < 2 for size, varies in zip(sizes, mask)):
        return None
    ahead = max(first - base[ref] for first, varies in zip(base, mask) if varies)
    top = padding.bucket(sizes[ref] + ahead) - ahead
    return tuple(top + first - base[ref] if varies else size for size, first, varies in zip(sizes, base, mask))


def run(schema: OpSchema, args, kwargs, desc: CallDescription):
    """Run a call with no exact plan yet at its size's bucket; NOT_BUCKETED where it cannot."""
    why = _why_exact(schema, desc)
    if why is not None:
        return _refuse(why)
    structure = _structure(desc)
    if structure is None:
        return _refuse("a CPU scalar tensor, a storage shared between arguments or a conj/neg view")
    why = _count_served(tuple(desc.key))
    if why is not None:
        return _refuse(why)
    family_key, sizes, may_vary = structure
    family_key = (schema.op, family_key, desc.index)
    streams = FAMILY_STREAMS.get(family_key)
    if streams is None:
        FAMILY_STREAMS.add(family_key, [_Stream(sizes)])
        return _refuse("the first call of its kind")
    ranks = [t.dim() for t in desc.tensors]
    owners = [i for i, r in enumerate(ranks) for _ in range(r)]
    stream = _stream_for(streams, sizes, owners, may_vary)
    padded = None if stream is None else _padded_sizes(stream, sizes)
    why = _why_not_growing(stream, padded)
    if why is not None:
        return _refuse(why)
    if schema.op is aten.cat.default:
        padded = _cat_at_bucket(args, kwargs, ranks, sizes, padded, stream.mask)
    shapes, varying = _per_tensor(padded, ranks), _per_tensor(stream.mask, ranks)
    # (strides of size-1 dimensions left out: a cache's new keys and values, one contiguous and one
    # a transposed view, share a plan; no address depends on them)
    statics = tuple(None if any(v) else (canonical_stride(t.shape, t.stride()), t.storage_offset())
                    for t, v in zip(desc.tensors, varying))
    # (the mask too: two streams of a family can pad to the same sizes along different axes)
    key = (family_key, padded, stream.mask, statics, tuple(desc.scalars) if schema.static_scalars else None)
    plan = _bucketed_plan(key, schema, args, kwargs, desc, shapes, varying)
    if not isinstance(plan, BucketedPlan):
        return _refuse(plan)
    return plan.run(args, kwargs, desc)


def _why_exact(schema: OpSchema, desc: CallDescription) -> str | None:
    """Why this call runs at its exact sizes whatever its sizes did, or None."""
    if not config.EAGER_BUCKETS:
        return "eager bucketing is off (TORCHNEURON_EAGER_BUCKETS=0)"
    if deferred._capture["recording"] is not None:
        return "graph captures run exact sizes"
    if schema.written or schema.functional is not schema.op:
        return "the op writes its arguments (in-place or out=)"
    if desc.index < 0 or not desc.tensors:
        return "no neuron tensor"
    return None


def _count_served(exact_key) -> str | None:
    """Count one more call of this exact signature served padded; why it now gets its own plan, or None."""
    served = _SERVED.get(exact_key, 0)
    if served >= EXACT_AFTER:  # a size that keeps coming back: its exact plan (no gathers) pays
        return f"this exact signature ran padded {EXACT_AFTER} times: it gets its own plan"
    if len(_SERVED) >= _SERVED_LIMIT:
        _SERVED.clear()
    _SERVED[exact_key] = served + 1
    return None


def _why_not_growing(stream, padded) -> str | None:
    """Why the sizes seen of a call's kind are not a growing one (with its padded sizes), or None."""
    if stream is None:
        return "its sizes did not grow together by one amount since a call of its kind"
    if stream.oscillates():
        return "its sizes go down as well as up (a loop over a few fixed sizes, not a growing one)"
    if stream.stands_still():
        return f"it met one size only, in {STILL_SEGMENTS} fused segments (a fixed size, not a growing one)"
    if padded is None:
        return "a growing size below 2"
    return None


def _per_tensor(values, ranks) -> list:
    """A flat tuple over every tensor's dimensions, cut per tensor."""
    cut, k = [], 0
    for r in ranks:
        cut.append(values[k:k + r])
        k += r
    return cut


def _bucketed_plan(key, schema: OpSchema, args, kwargs, desc: CallDescription, shapes, varying):
    """The BucketedPlan under `key`, built at its first call, or the reason the op refused to run padded."""
    plan = BUCKETED_PLANS.get(key, _MISSING)
    if plan is not _MISSING:
        return plan
    plan = _build(schema, args, kwargs, desc, shapes, varying)
    BUCKETED_PLANS.add(key, plan)
    if not isinstance(plan, BucketedPlan):
        STATS["refused"] += 1
        return plan
    STATS["plans"] += 1
    executables.when_empty(plan.function, functools.partial(BUCKETED_PLANS.discard, key, plan), key)
    if "recompiles" in config.LOG:
        growing = ", ".join(f"tensor {i} dim {d}" for i, v in enumerate(varying) for d, g in enumerate(v) if g)
        print(f"torchneuron recompile: {schema.op} for shapes {[list(t.shape) for t in desc.tensors]} "
              f"(growing: {growing}): bucketed, runs at {[list(x) for x in shapes]}", file=sys.stderr)
    return plan


def _cat_at_bucket(args, kwargs, ranks, sizes, padded, mask):
    """`cat`'s padded sizes with its result at the bucket of its true size along the joined axis.

    A KV cache's `cat` turns n - 1 positions into n. Padded from its inputs, the result would hold
    bucket(n - 1) + 1 positions, and attention over those n positions (run at bucket(n)) would meet
    a buffer one position longer than a bucket at the first step of each bucket: a second program
    of attention, and of everything else that reads the cache, per bucket. The first operand that
    grows along the axis takes up the difference; a plan's sizes stay fixed within a bucket."""
    tensors = args[0] if args else kwargs["tensors"]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if len(ranks) != len(tensors) or not ranks or len(set(ranks)) != 1:
        return padded  # (cat's legacy 1-d empty operands: padded as they are)
    rank = ranks[0]
    dim %= rank
    along = [i * rank + dim for i in range(len(ranks))]
    grows = [k for k in along if mask[k]]
    if not grows:
        return padded
    first = grows[0]
    at = padded[first] + padding.bucket(sum(sizes[k] for k in along)) - sum(padded[k] for k in along)
    if at < sizes[first]:
        return padded  # (other operands padded past the bucket: as they are)
    padded = list(padded)
    padded[first] = at
    return tuple(padded)


_WHY = [None]  # why the latest call that was not bucketed was not (TORCHNEURON_LOG=recompiles)


def _refuse(reason: str):
    _WHY[0] = reason
    return NOT_BUCKETED


def why_not() -> str | None:
    """Why the latest call run at exact sizes was not bucketed."""
    return _WHY[0]


def _build(schema, args, kwargs, desc, shapes, varying):
    """The bucketed plan, or the reason the op refuses to run padded."""
    try:
        return BucketedPlan(schema, args, kwargs, desc, shapes, varying)
    except _Refused as e:
        return str(e)


class _Refused(Exception):
    """This op (or this call of it) does not run padded: it runs at exact sizes."""


def _replace_tensors(args, kwargs, make):
    """args and kwargs with the n-th neuron tensor replaced by make(n, tensor)."""
    counter = iter(range(1 << 30))

    def convert(value):
        if isinstance(value, torch.Tensor) and value.device.type == "neuron":
            i = next(counter)
            return make(i, value)
        if isinstance(value, (list, tuple)):
            return type(value)(convert(v) for v in value)
        return value

    return [convert(a) for a in args], {k: convert(v) for k, v in kwargs.items()}


class _Index:
    """A tensor's place in the call, standing in for it where padding rules bind names."""

    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


def _names_of(op, args, kwargs) -> dict:
    """Argument name -> indices of the call's neuron tensors under it."""
    indexed, indexed_kwargs = _replace_tensors(args, kwargs, lambda i, t: _Index(i))
    names = {}
    for name, value in padding.bind(op, indexed, indexed_kwargs).items():
        found = [v.i for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, _Index)]
        if found:
            names[name] = found
    return names


def _lowering_that_pads(op):
    """`op`'s lowering where it may run padded; refused where there is none, or it is data dependent,
    a user's, graph-only or checked on the device."""
    lowering = record_of(op).lowering
    if lowering is None or lowering.data_dependent or lowering.user_code or lowering.graph_only or (
            lowering.checks and config.DEVICE_ASSERTS):
        raise _Refused("no lowering that runs padded (none, data dependent, a user's, or device-checked)")
    return lowering


def _rows_to_widen(tensors, shapes, varying) -> list:
    """Per tensor read row by row: (its index, the elements it reads, the room a shorter buffer is
    widened to first: its bucket's, which a cache's buffer has on every later step)."""
    widen = []
    for i, (shape, varies) in enumerate(zip(shapes, varying)):
        grows = [d for d, v in enumerate(varies) if v]
        if len(grows) == 1:
            outer, size, inner = _rows(shape, grows[0])
            widen.append((i, outer * size * inner, outer * padding.bucket(size) * inner,
                          np.dtype(to_jax(tensors[i].dtype))))
    return widen


class BucketedPlan:
    """One op at one bucket of its varying size: a program over the arguments' buffers and a vector
    of their true sizes (and the results'), making each result in a buffer of its padded size."""

    def __init__(self, schema: OpSchema, args, kwargs, desc: CallDescription, shapes, varying):
        op = schema.op
        lowering = _lowering_that_pads(op)
        self.schema, self.op, self.lowering = schema, op, lowering
        self.shapes, self.varying = shapes, varying
        tensors = desc.tensors
        self.dtypes = [t.dtype for t in tensors]
        self.layouts = [None if any(v) else Layout(tuple(t.shape), tuple(t.stride()), t.storage_offset())
                        for t, v in zip(tensors, varying)]
        self.widen = _rows_to_widen(tensors, shapes, varying)
        self.template_args, self.template_kwargs = template_of(schema, args, kwargs)
        if draws_random(lowering, op, self.template_args, self.template_kwargs):
            raise _Refused("it draws random numbers")
        self.static_scalars = list(desc.scalars) if lowering.static_scalars else None
        margs, mkwargs = _replace_tensors(args, kwargs, lambda i, t: torch.empty_strided(
            shapes[i], contiguous_stride(shapes[i]) if any(varying[i]) else t.stride(), dtype=t.dtype, device="meta"))
        padded_out, outs = self._run_padded_meta(margs, mkwargs)
        self.result_axes = _result_axes(op, args, kwargs, outs, shapes, varying)
        self.compute_dtype = calling.compute_dtype(lowering, schema.names, margs, mkwargs)
        self.layout_flags = calling.static_flags(op, lowering, margs, mkwargs, padded_out)
        self.names = _names_of(op, args, kwargs)
        self.cat_dim = None
        self.fills: list = []  # (tensor index, varying axes to fill, value)
        self.masked = None
        self.counted: list = []
        if op is aten.cat.default:
            if any(t.numel() == 0 for t in tensors):
                raise _Refused("an empty operand (cat skips those whatever their shape)")
            self.cat_dim = padding.bind(op, margs, mkwargs)["dim"] % len(shapes[0])
        else:
            self._follow_padding_rule(padding.padding_of(op, margs, mkwargs))
        # the sizes vector: every dimension of every tensor argument, then of every tensor result
        self.n_tensors = len(tensors)
        self.growing_at = _growing_at(varying, self.results, self.result_axes)
        self.function = executables.Function(self._body, "eager", f"{op} (bucketed)", identity=self._identity())
        self.prototypes = [torch.empty(0, dtype=r[2], device=desc.device) if r[0] == "tensor" else None
                           for r in self.results]
        self._seen: dict = {}  # (argument sizes, scalars) -> _true_results

    def _run_padded_meta(self, margs, mkwargs):
        """The meta kernel at the padded sizes: its outputs (and as a tuple), each return noted in
        self.results as ("tensor", padded shape, dtype), ("int",) or ("none",)."""
        try:
            padded_out = run_meta(self.op, margs, mkwargs)
        except _META_ERRORS as e:  # a padded call the meta kernel refuses: run at exact sizes
            raise _Refused(f"its meta kernel refuses the padded sizes: {e}") from e
        outs = padded_out if len(self.op._schema.returns) > 1 else (padded_out,)
        self.results = []
        for alias, out in zip(self.schema.return_aliases, outs):
            if alias is not None or isinstance(out, (list, tuple)):
                raise _Refused("it returns a view or a list")
            if isinstance(out, torch.Tensor):
                self.results.append(("tensor", tuple(out.shape), out.dtype))
            elif isinstance(out, (int, torch.SymInt)) and not isinstance(out, bool):
                self.results.append(("int",))
            elif out is None:
                self.results.append(("none",))
            else:
                raise _Refused(f"it returns a {type(out).__name__}")
        return padded_out, outs

    def _follow_padding_rule(self, rule) -> None:
        """What the op's padding rule asks of its padded operands: refused where an operand must not
        grow, the fills of the padding, the mask of a counted reduction."""
        if rule is None:
            raise _Refused("no padding rule (lowering/padding.py) says it is exact on padded operands")
        varying = self.varying
        for name, axes in rule.exact:
            if any(varying[i][a] for i in self.names.get(name, ()) for a in axes if a < len(varying[i])):
                raise _Refused(f"its padding rule forbids padding {name!r} along the growing axis")
        for fill in rule.fills:
            for i in self.names.get(fill.operand, ()):
                axes = tuple(a for a in fill.axes if a < len(varying[i]) and varying[i][a])
                if axes:
                    self.fills.append((i, axes, fill.value))
        if rule.masked is not None:
            self.masked = rule
            i = self.names[rule.counted][0]
            self.counted = [(i, a) for a in rule.counted_axes if varying[i][a]]

    def _identity(self) -> str:
        """Everything the program depends on besides its buffers: the persistent cache loads it by
        this name in a later process without tracing it."""
        layouts = [None if lay is None else lay._replace(stride=canonical_stride(lay.shape, lay.stride))
                   for lay in self.layouts]
        return repr(("bucketed", str(self.op), self.shapes, self.varying, self.dtypes, layouts,
                     self.template_args, self.template_kwargs, self.static_scalars, self.results,
                     self.compute_dtype, self.layout_flags, self.cat_dim, self.fills, self.counted,
                     self.masked is not None))

    # ------------------------------------------------------------ tracing
    def _body(self, *flat):
        n = self.n_tensors
        buffers, sizes, scalars = flat[:n], flat[n], flat[n + 1:]
        at = 0
        true_dims = []  # per tensor argument: its sizes, traced where they vary
        for shape, varies in zip(self.shapes, self.varying):
            true_dims.append([sizes[at + d] if v else shape[d] for d, v in enumerate(varies)])
            at += len(shape)
        values = []
        for i, (buf, dt) in enumerate(zip(buffers, self.dtypes)):
            buf = storages.bitcast(buf, to_jax(dt))
            if self.layouts[i] is not None:
                values.append(read(buf, self.layouts[i]))
            else:
                values.append(_read_padded(buf, self.shapes[i], true_dims[i], self.varying[i]))
        for i, axes, value in self.fills:
            keep = _valid(self.shapes[i], true_dims[i], axes)
            values[i] = jnp.where(keep, values[i], jnp.asarray(value, values[i].dtype))
        scalars = [jnp.asarray(s) for s in scalars]
        results = self._compute(values, scalars, true_dims)
        outputs = []
        for k, (r, result) in enumerate(zip(self.results, results)):
            if r[0] != "tensor":
                continue
            shape = r[1]
            true = [sizes[at + d] for d in range(len(shape))]
            at += len(shape)
            value = jnp.broadcast_to(result, shape).astype(to_jax(r[2]))
            axes = self.result_axes[k] if self.result_axes is not None else None
            if axes == ():  # (no size of this result grows: laid out as it is)
                outputs.append(value.reshape(-1) if shape else value.reshape(1))
            elif axes is not None and len(axes) == 1:
                outputs.append(_write_rows(value, shape, axes[0], true[axes[0]]))
            else:
                outputs.append(_write_padded(value, shape, true))
        return tuple(outputs)

    def _compute(self, values, scalars, true_dims):
        if self.cat_dim is not None:
            return (self._cat(values, true_dims),)

        call_args, call_kwargs = fill_template(self.template_args, self.template_kwargs, values,
                                               scalars if self.static_scalars is None else self.static_scalars)
        if self.masked is None:
            return calling.invoke(self.op, self.lowering, call_args, call_kwargs, self.compute_dtype, None,
                                  self.layout_flags)
        call = padding.bind(self.op, call_args, call_kwargs)
        valid = True
        for i, axis in self.counted:
            valid = valid & _valid(self.shapes[i], true_dims[i], (axis,))
        results = self.masked.masked(call, valid)
        return tuple(results) if len(self.op._schema.returns) > 1 else (results,)

    def _cat(self, values, true_dims):
        """Each operand written at the sum of the true sizes before it: a later operand overwrites
        an earlier one's padding, the last one's lies past the true size."""
        dim = self.cat_dim
        shape, dtype = self.results[0][1], to_jax(self.results[0][2])
        out = jnp.zeros(shape, dtype)
        offset = 0
        for value, true in zip(values, true_dims):
            start = [0] * len(shape)
            start[dim] = offset
            out = lax.dynamic_update_slice(out, value.astype(dtype), start)
            offset = offset + true[dim]
        return out

    # ------------------------------------------------------------ calling
    def run(self, args, kwargs, desc: CallDescription):
        """The call at its bucket: the meta kernel at the true sizes gives the results' sizes (and
        PyTorch's errors); NOT_BUCKETED if they do not fit the padded results."""
        sizes = [s for t in desc.tensors for s in t.shape]
        results = self._true_results(args, kwargs, desc, sizes)
        if results is None:
            return NOT_BUCKETED  # (the exact path raises the meta kernel's error with its own wording)
        for r, out in zip(self.results, results):
            if r[0] == "tensor":
                sizes.extend(out)
        buffers = buffers_of(desc) if desc.missing else desc.buffers
        if self.widen:
            buffers = _widened(buffers, desc.handles, self.widen)
        flat = [*buffers, np.asarray(sizes, np.int64)]
        if desc.scalars and self.static_scalars is None:
            flat += [host_scalar(v) for v in desc.scalars]
        STATS["calls"] += 1
        if deferred._mode["fused"]:  # recorded: a segment of bucketed calls repeats within the bucket
            reach = max((sizes[k] for k in self.growing_at), default=0)
            outputs = iter(deferred.record(self.function, flat, desc.index, reach=reach))
        else:
            outputs = self.function(*flat)
            if storages.KEEP_RECENT:  # (synchronize waits for them, as for any plan's results)
                storages.keep_recent(outputs)
            outputs = iter(outputs)
        returns = []
        for r, out, prototype in zip(self.results, results, self.prototypes):
            if r[0] == "tensor":
                t = prototype.new_empty(out)
                storages.bind(t.data_ptr(), next(outputs))  # (a buffer longer than the storage's bytes)
                returns.append(t)
            else:
                returns.append(out)
        return tuple(returns) if len(returns) > 1 else returns[0]

    def _true_results(self, args, kwargs, desc: CallDescription, sizes) -> list | None:
        """Per result, its true sizes (a tensor's), its value (an int's) or None; None where the
        meta kernel refuses the true sizes or a result does not fit its padded size. From the op's
        size rule where it has one (its record's `true_shapes`), else its meta kernel. Remembered for the latest
        few argument sizes: a step meets each size once per layer, and for keys and values alike."""
        key = (tuple(sizes), tuple(desc.scalars))
        found = self._seen.get(key, _MISSING)
        if found is not _MISSING:
            return found
        rule = record_of(self.op).true_shapes
        true_out = rule(*args, **kwargs) if rule is not None else None
        if true_out is None:
            true_out = _meta_results(self.op, args, kwargs)
        found = None if true_out is None else []
        axes_of = self.result_axes or [None] * len(self.results)
        for r, out, axes in zip(self.results, true_out, axes_of):
            if found is None:
                break
            if r[0] == "tensor":
                if len(out) != len(r[1]) or any(a > b or a == 0 for a, b in zip(out, r[1])) or (
                        axes is not None and any(a != b for d, (a, b) in enumerate(zip(out, r[1]))
                                                 if d not in axes)):
                    found = None  # (a size the program lays out as padded that is not: exact sizes)
                else:
                    found.append(out)
            else:
                found.append(int(out) if r[0] == "int" else None)
        if len(self._seen) >= 8:
            self._seen.clear()
        self._seen[key] = found
        return found


def _meta_results(op, args, kwargs) -> list | None:
    """The op's results at the call's true sizes from its meta kernel (a tensor's as its shape), or
    None where the kernel refuses them."""
    metas, meta_kwargs = _replace_tensors(args, kwargs, lambda i, t: torch.empty_strided(
        t.shape, t.stride(), dtype=t.dtype, device="meta"))
    try:
        out = run_meta(op, metas, meta_kwargs)
    except _META_ERRORS:
        return None
    if out is None:
        return None
    outs = out if len(op._schema.returns) > 1 else (out,)
    return [tuple(o.shape) if isinstance(o, torch.Tensor) else o for o in outs]


def _growing_at(varying, results, result_axes) -> list:
    """Where the sizes vector holds a growing size: the varying dimensions of the arguments, then
    the growing axes of the tensor results (where known)."""
    at = [k for k, varies in enumerate(v for per_tensor in varying for v in per_tensor) if varies]
    offset = sum(len(v) for v in varying)
    for r, axes in zip(results, result_axes or [None] * len(results)):
        if r[0] != "tensor":
            continue
        at += [offset + a for a in axes or ()]
        offset += len(r[1])
    return at


def _widened(buffers, handles, widen):
    """The call's buffers, each one shorter than the padded size its plan reads widened to its
    bucket's room (zeros appended, the storage rebound to the wider buffer).

    A cache's buffer has its bucket's room on every step but the first of a bucket, which reads
    the previous bucket's smaller buffer: without this, that step's program (or, in fused eager,
    its whole segment) is another signature, compiled once per bucket for one call. Widening is a
    small program per pair of lengths, shared by every cache and layer of those sizes."""
    widened = None
    for i, need, room, dtype in widen:
        buf = buffers[i]
        if type(buf) is deferred.Pending or buf.shape[0] >= need or buf.dtype != dtype:
            continue  # (a pending value: its segment's program reads it as it is)
        if widened is None:
            widened = list(buffers)
        widened[i] = storages.widened(buf, room)
        if handles[i]:
            storages.bind(handles[i], widened[i])
    return buffers if widened is None else widened


def _true_strides(true) -> list:
    strides, acc = [], 1
    for n in reversed(true):
        strides.append(acc)
        acc = acc * n
    return strides[::-1]


def _result_axes(op, args, kwargs, outs, shapes, varying):
    """Per result, the axes whose size grows with the call's varying sizes (those the meta kernel
    changes when every varying size is one smaller), or None where that cannot be told."""
    smaller = [tuple(n - 1 if v else n for n, v in zip(shape, varies)) for shape, varies in zip(shapes, varying)]
    try:
        args, kwargs = _replace_tensors(args, kwargs, lambda i, t: torch.empty_strided(
            smaller[i], contiguous_stride(smaller[i]) if any(varying[i]) else t.stride(), dtype=t.dtype,
            device="meta"))
        shrunk = run_meta(op, args, kwargs)
    except _META_ERRORS:
        return None
    shrunk = shrunk if len(op._schema.returns) > 1 else (shrunk,)
    axes = []
    for out, small in zip(outs, shrunk):
        if not isinstance(out, torch.Tensor):
            axes.append(None)
        elif not isinstance(small, torch.Tensor) or small.dim() != out.dim():
            return None
        else:
            axes.append(tuple(d for d, (a, b) in enumerate(zip(out.shape, small.shape)) if a != b))
    return axes


def _rows(shape, axis):
    """(outer, padded, inner): a tensor as rows of its growing axis, `outer` of them, each
    `padded` x `inner` elements long."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _read_rows(buf, shape, axis, true):
    """A contiguous tensor whose size along `axis` is `true` (traced), read as the padded `shape`:
    one slice per outer index (its rows are contiguous at the true size as at the padded one), rows
    past the true size zeroed. A gather of whole rows, where an index per element costs ~10x."""
    outer, padded, inner = _rows(shape, axis)
    window = padded * inner
    need = outer * window  # (the last slice ends by (outer - 1) * true * inner + window at most)
    if buf.shape[0] < need:  # (an exact-size buffer: slices past its end would be moved back)
        buf = jnp.pad(buf, (0, need - buf.shape[0]))
    starts = jnp.arange(outer, dtype=jnp.int64) * (true * inner)
    rows = jax.vmap(lambda start: lax.dynamic_slice(buf, (start,), (window,)))(starts)
    rows = rows.reshape(outer, padded, inner)
    keep = lax.broadcasted_iota(jnp.int64, rows.shape, 1) < true
    return jnp.where(keep, rows, jnp.zeros((), rows.dtype)).reshape(shape)


def _write_rows(value, shape, axis, true):
    """`value` (padded `shape`, growing along `axis` only) laid out densely at its true size along
    `axis`, in a buffer of the padded size: each outer index's rows written in turn at its true
    offset, so the next one overwrites the padding the previous one wrote past its true end."""
    outer, padded, inner = _rows(shape, axis)
    rows = value.reshape(outer, padded * inner)
    out = jnp.zeros((max(outer * padded * inner, 1),), value.dtype)
    step = true * inner
    if outer <= 16:
        for o in range(outer):
            out = lax.dynamic_update_slice(out, rows[o], (o * step,))
        return out
    return lax.fori_loop(0, outer, lambda o, acc: lax.dynamic_update_slice(acc, rows[o], (o * step,)), out)


def _read_padded(buf, shape, true, varies):
    """A contiguous tensor of sizes `true` (traced where they vary) read as the padded `shape`,
    zeros at the padded positions."""
    if not shape:
        return buf[0]
    grows = [d for d, v in enumerate(varies) if v]
    if len(grows) == 1:
        return _read_rows(buf, shape, grows[0], true[grows[0]])
    index = 0
    for d, stride in enumerate(_true_strides(true)):
        index = index + lax.broadcasted_iota(jnp.int64, shape, d) * stride
    value = jnp.take(buf, index, mode="clip")
    axes = tuple(d for d, v in enumerate(varies) if v)
    return jnp.where(_valid(shape, true, axes), value, jnp.zeros((), value.dtype))


def _valid(shape, true, axes):
    keep = jnp.ones(shape, bool)
    for d in axes:
        keep = keep & (lax.broadcasted_iota(jnp.int64, shape, d) < true[d])
    return keep


def _write_padded(value, shape, true):
    """`value` (padded `shape`) laid out densely at its true sizes, in a buffer of the padded size."""
    length = max(math.prod(shape), 1)
    if not shape:
        return value.reshape(1)
    position = jnp.arange(length, dtype=jnp.int64)
    index = 0
    for d, (stride, padded_stride) in enumerate(zip(_true_strides(true), contiguous_stride(shape))):
        index = index + (position // stride) % true[d] * padded_stride
    return jnp.take(value.reshape(-1), index, mode="clip")


def stats() -> dict:
    """Eager bucketing's counters: calls run padded, bucketed plans built, plans refused."""
    return {"bucketed_calls": STATS["calls"], "bucketed_plans": STATS["plans"], "bucketed_refused": STATS["refused"]}
