"""One record per ATen overload: everything torchneuron knows about the op, in one place.

A family file (elementwise.py, indexing.py, ...) fills an op's record where it lowers the op, with
the registration functions of this package: `lowers` (the JAX function and how drivers call it),
`overrides_meta`, `refuses` (argument and dtype rules CPU's kernel applies), `pads` (padding.py:
how the op stays exact on padded operands), `sizes_from` (its results' sizes without the meta
kernel), `takes_host_operands`, `runs_as`, `functional_of`, `refused` and `redirected` (eager's
kernels), `sparse_kernel` (sparse COO kernels, torchneuron/sparse/), `autocasts` (autocast.py) and
`collective` (collectives.py). The drivers (eager, compile, amp, conformance, sparse) read the
record; none keeps a table keyed by op. docs/ADDING_AN_OP.md walks through one op.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping

import torch

OpOverload = torch._ops.OpOverload


@dataclasses.dataclass(eq=False)
class OpRecord:
    """What torchneuron knows about `op`. Every field but `op` is optional: an in-place or out=
    overload usually holds nothing (the eager driver runs it through its functional's lowering)."""

    op: OpOverload
    lowering: object | None = None  # a Lowering (lowering/__init__.py): the JAX function
    meta: Callable | None = None  # the meta function, where PyTorch's is missing or follows CUDA
    refusals: list[Callable] = dataclasses.field(default_factory=list)  # checks CPU's kernel makes
    padding: Callable | None = None  # rule(call) -> padding.Padding | None, for bucketed sizes
    true_shapes: Callable | None = None  # results' sizes from the arguments (a fast meta for sizes)
    host_operands: tuple[str, ...] = ()  # arguments whose CPU tensors move to the device, as on CUDA
    runs_as: OpOverload | None = None  # the lowered overload a call runs as (a CPU tensor of scalars)
    functional: OpOverload | None = None  # an in-place op's functional, where the name does not tell
    out_from: OpOverload | None = None  # an out= overload filled from this functional's own kernel
    refused: str | None = None  # why neuron refuses the op, and what to use instead
    redirect: Callable | None = None  # a neuron kernel made of ops that dispatch
    sparse: Callable | None = None  # the kernel for sparse COO neuron tensors, of dense ops that dispatch
    autocast: str | None = None  # "lower" | "fp32" | "promote": CUDA's autocast policy
    collective: object | None = None  # a functional collective's start (collectives.Collective)
    spmd: Callable | None = None  # a functional collective's value inside an SPMD (shard_map) program


    def __repr__(self) -> str:
        known = ", ".join(f"{f.name}={_short(getattr(self, f.name))}" for f in dataclasses.fields(self)[1:]
                          if _present(getattr(self, f.name)))
        return f"OpRecord({self.op}: {known or 'nothing'})"


def _short(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    name = getattr(value, "__qualname__", None) or getattr(getattr(value, "fn", None), "__qualname__", None)
    return name if name is not None else repr(value)


RECORDS: dict[OpOverload, OpRecord] = {}


def record(op: OpOverload) -> OpRecord:
    """`op`'s record, made empty on first use."""
    found = RECORDS.get(op)
    if found is None:
        found = RECORDS[op] = OpRecord(op)
    return found


def overloads(packet: torch._ops.OpOverloadPacket) -> list[OpOverload]:
    return [getattr(packet, name) for name in packet.overloads()]


def _present(value) -> bool:
    return value is not None and not (isinstance(value, (tuple, list)) and not value)


class Facet(Mapping):
    """A read-only view of one field across the records: op -> value, for the ops that have one.
    (`LOWERINGS` is the lowering facet: every lowered op and its Lowering.)"""

    def __init__(self, field: str):
        self.field = field

    def get(self, op, default=None):
        found = RECORDS.get(op)
        if found is None:
            return default
        value = getattr(found, self.field)
        return value if _present(value) else default

    def __getitem__(self, op):
        value = self.get(op)
        if value is None:
            raise KeyError(op)
        return value

    def __contains__(self, op) -> bool:
        return self.get(op) is not None

    def __iter__(self) -> Iterator[OpOverload]:
        return (op for op, r in list(RECORDS.items()) if _present(getattr(r, self.field)))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"Facet({self.field!r}: {len(self)} ops)"


NO_RECORD = OpRecord(None)  # what `record_of` answers for an op nothing is known of (read it, never fill it)


def record_of(op) -> OpRecord:
    """`op`'s record, or NO_RECORD: for drivers, which only read."""
    return RECORDS.get(op, NO_RECORD)
