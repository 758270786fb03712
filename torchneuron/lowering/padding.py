"""Which ops may run on operands padded along an axis, and what they need to stay exact.

An axis is padded when its size runs rounded up (a shape bucket) and only its first `true` positions
hold data. A rule is a function of one op call's arguments, bound by name (tensors as real or fake
tensors: only ndim and dtype are read), that returns a `Padding` saying how the call stays exact on
padded operands, or None where it cannot. Axes a rule does not name are position-wise: a padded
position there only ever changes the same position of the result. The compile driver consults
`padding_of` for the ops of an FX graph (compile/buckets.py); rules speak of a call's arguments, not
of graph nodes, so that the eager driver can consult the same ones for single calls.

The rules sit beside the ops' lowerings in the family files (`@pads(op)` puts the rule on the op's
record); this module holds what they are made of and how drivers read them.

    >>> call = bind(aten.sum.dim_IntList, (torch.ones(4, 3), [0]), {})
    >>> rule_for(aten.sum.dim_IntList)(call).fills
    (Fill(operand='self', axes=(0,), value=0),)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax.numpy as jnp
import torch

from .. import config
from .records import RECORDS, record

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Fill:
    """Padded positions of `operand` along `axes` (those of them that are padded) become `value`."""

    operand: str
    axes: tuple[int, ...]
    value: float | int | bool


@dataclasses.dataclass(frozen=True)
class Padding:
    """How one call stays exact on padded operands.

    fills: operands masked before the op runs. exact: (operand, axes) that must not be padded.
    masked: where the op needs the true size, an implementation `masked(call, valid)` over the bound
    arguments (arrays) and `valid`, a boolean array broadcastable to operand `counted`, true at the
    unpadded positions of its `counted_axes`.
    """

    fills: tuple[Fill, ...] = ()
    exact: tuple[tuple[str, tuple[int, ...]], ...] = ()
    masked: Callable | None = None
    counted: str = "self"
    counted_axes: tuple[int, ...] = ()


POSITION_WISE = Padding()


def bucket(size: int) -> int:
    """The padded size a dynamic size runs at: the next power of two, at least config.MIN_BUCKET
    (compiled graphs and eager ops alike)."""
    return max(config.MIN_BUCKET, 1 << max(size - 1, 0).bit_length())


# Ops that only regroup a tensor's elements into new axes (view/reshape): position-wise per
# element, but an axis they merge or split is padded as its factors are (the caller tracks that).
REGROUPING = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default})


def pads(*ops):
    """Register `rule(call) -> Padding | None` as the padding rule of each of `ops` (on its record)."""
    def register(rule):
        for op in ops:
            record(op).padding = rule
        return rule
    return register


def rule_for(op) -> Callable | None:
    """The padding rule of `op`: registered, or position-wise for pointwise ops; None if unknown."""
    found = RECORDS.get(op)
    rule = found.padding if found is not None else None
    if rule is None and isinstance(op, torch._ops.OpOverload) and torch.Tag.pointwise in op.tags:
        return position_wise
    return rule


def bind(op, args, kwargs) -> dict:
    """The call's arguments by name, defaults filled in."""
    call = {}
    for i, a in enumerate(op._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            call[a.name] = args[i]
        elif a.name in kwargs:
            call[a.name] = kwargs[a.name]
        elif a.has_default_value():
            call[a.name] = a.default_value
    return call


def reduced_axes(call, name="dim") -> tuple[int, ...]:
    """The axes a reduction reduces: its `dim` argument, every axis when it is None or empty."""
    ndim = call["self"].ndim
    dims = call.get(name)
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return tuple(range(ndim))
    dims = [dims] if isinstance(dims, int) else dims
    return tuple(d % max(ndim, 1) for d in dims)


def all_axes(t) -> tuple[int, ...]:
    return tuple(range(t.ndim))


def lowest(dtype):
    if dtype.is_floating_point:
        return -math.inf
    return False if dtype is torch.bool else torch.iinfo(dtype).min


def highest(dtype):
    if dtype.is_floating_point:
        return math.inf
    return True if dtype is torch.bool else torch.iinfo(dtype).max


def position_wise(call):
    return POSITION_WISE


def wide(x):
    """Low-precision floats count in float32, as the reductions' lowerings do."""
    return x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize < 4 else x


def padding_of(op, args, kwargs) -> Padding | None:
    """How the call `op(*args, **kwargs)` stays exact on padded operands; None where unknown or unsafe."""
    rule = rule_for(op)
    if rule is None:
        return None
    return rule(bind(op, args, kwargs))
