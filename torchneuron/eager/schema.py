"""What the eager driver needs to know about an op's schema, computed once per op.

- which arguments hold tensors, traced scalars, or static values;
- which arguments an op writes (in-place, out=, or mutating ops like batch norm's stats);
- which functional overload computes its values (add_ and add.out -> add.Tensor).
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from ..lowering import RECORDS, record_of
from ..lowering.calling import Kind, kind_of

aten = torch.ops.aten


@dataclasses.dataclass
class OpSchema:
    op: torch._ops.OpOverload
    names: list[str]
    kinds: list[Kind]
    kind_by_name: dict[str, Kind]
    written: list[int]  # indices of arguments the op writes
    out_args: list[int]  # indices of out= arguments (subset of written)
    return_aliases: list[int | None]  # per return: index of the argument it is, or None (fresh)
    functional: torch._ops.OpOverload | None  # overload that computes the values
    view: bool  # returns a view of an input without writing
    # Whether conj/neg-bit views reach the kernel as they are: only for ops with their own
    # Conjugate or Negative kernel (copy_, clone, mm, ...); PyTorch resolves them for the rest.
    math_bits: bool
    # how many arguments from the first are tensors or scalars (add: 2, sum: 1, pow.Tensor_Scalar: 2),
    # and which of them are scalars: the eager driver's one-pass path takes calls of just those
    leading_operands: int
    scalar_args: frozenset
    list_returns: tuple  # per return: whether it is a list of tensors (an empty list, not None, when absent)
    static_scalars: bool  # the lowering's scalars shape its result (arange): one plan per value
    name: str  # "aten.add.Tensor" (str(op), which costs a microsecond a call)
    host_operands: tuple[str, ...]  # arguments whose CPU tensors move to the device (its record's)

    @property
    def mutates(self) -> bool:
        return bool(self.written)


@functools.cache
def parse(op: torch._ops.OpOverload) -> OpSchema:
    """The schema facts the drivers need (cached: one parse per overload)."""
    s = op._schema
    args = s.arguments
    names = [a.name for a in args]
    written = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
    out_args = [i for i in written if args[i].is_out]
    functional = functional_variant(op, written, out_args)
    lowering = record_of(functional).lowering
    kinds = [kind_of(a, lowering.traced if lowering is not None else ()) for a in args]
    leading = next((i for i, k in enumerate(kinds) if k is not Kind.TENSOR and k is not Kind.SCALAR), len(kinds))
    aliases = []
    view = False
    for r in s.returns:
        if r.alias_info is None:
            aliases.append(None)
            continue
        match = [i for i, a in enumerate(args) if a.alias_info is not None
                 and a.alias_info.before_set == r.alias_info.before_set]
        aliases.append(match[0] if match else None)
        view = view or not r.alias_info.is_write
    return OpSchema(op, names, kinds, dict(zip(names, kinds)), written, out_args, aliases,
                    functional, view, _sees_math_bits(op), leading,
                    frozenset(i for i in range(leading) if kinds[i] is Kind.SCALAR),
                    tuple(str(r.type).startswith("List") for r in s.returns),
                    lowering is not None and lowering.static_scalars, str(op), record_of(op).host_operands)


def _sees_math_bits(op: torch._ops.OpOverload) -> bool:
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    try:
        return has(op.name(), "Conjugate") or has(op.name(), "Negative")
    except RuntimeError:  # a TorchScript-only overload (add.t): never dispatched with tensors
        return False


# A factory's out= overload has no TensorOptions: the out tensor decides dtype and device.
_TENSOR_OPTIONS = {"dtype", "layout", "device", "pin_memory"}


def _signature(schema, drop: set[str]) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments if a.name not in drop]


def _explicit_functional(op) -> torch._ops.OpOverload | None:
    """An in-place op's functional where its name does not tell (its record's `functional`)."""
    return record_of(op).functional


def inplace_packets(functional_name: str) -> list[str]:
    """Packets holding in-place ops whose records name an overload of `functional_name` as their functional."""
    return sorted({r.op._schema.name.split("::")[1] for r in list(RECORDS.values())
                   if r.functional is not None and r.functional._schema.name.split("::")[1] == functional_name})


def _same_signature(op, packet) -> torch._ops.OpOverload | None:
    """The overload of `packet` taking what in-place `op` takes, when their overload names differ
    (floor_divide_.Tensor -> floor_divide.default, pow_.Tensor -> pow.Tensor_Tensor)."""
    want = [(n, t.replace("Tensor(a!)", "Tensor")) for n, t in _signature(op._schema, set())]
    if want[0][1] != "Tensor":
        return None  # list ops such as mul_.t
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        returns_view = any(r.alias_info is not None for r in candidate._schema.returns)
        if not returns_view and _signature(candidate._schema, set()) == want:
            return candidate
    return None


def functional_variant(op, written, out_args) -> torch._ops.OpOverload | None:
    """add_.Tensor -> add.Tensor; add.out -> add.Tensor; _native_batch_norm_legit ->
    _native_batch_norm_legit_functional; a functional op -> itself."""
    if not written:
        return op
    name = op._schema.name.split("::")[1]
    args = op._schema.arguments
    if out_args:
        packet = getattr(aten, name)
        want = _signature(op._schema, {args[i].name for i in out_args})
        for overload in packet.overloads():
            candidate = getattr(packet, overload)
            absent = _TENSOR_OPTIONS - {n for n, _ in want}
            if candidate is not op and _signature(candidate._schema, absent) == [
                    (n, t.replace("Tensor(a!)", "Tensor")) for n, t in want]:
                return candidate
        return None
    explicit = _explicit_functional(op)
    if explicit is not None:
        return explicit
    if name.endswith("_") and written == [0]:
        packet = getattr(aten, name[:-1], None)
        overload = op._overloadname
        if packet is None:
            return None
        if overload in packet.overloads():
            same_name = getattr(packet, overload)
            want = [(n, t.replace("Tensor(a!)", "Tensor")) for n, t in _signature(op._schema, set())]
            if _signature(same_name._schema, set()) == want:
                return same_name
            return None  # same name, other arguments (polygamma_(self, n) vs polygamma(n, self))
        return _same_signature(op, packet)
    packet = getattr(aten, name + "_functional", None)
    if packet is not None and op._overloadname in packet.overloads():
        return getattr(packet, op._overloadname)
    return None
