"""Functional collectives inside one SPMD program: each rank's tensors are its block of a global
array mapped over mesh axis AXIS (compile/xla_collectives.py traces such graphs as a `shard_map`),
and a collective is its `jax.lax` counterpart over that axis (the record's `spmd`: not a lowering an
eager call or a single-device graph can use). The record's `collective` says how a segmented graph
issues the op to the process group (compile/collectives.py).
"""
from __future__ import annotations

import dataclasses

import jax
import torch

from . import record

AXIS = "ranks"
_F = torch.ops._c10d_functional


@dataclasses.dataclass(frozen=True)
class Collective:
    """A functional collective's start op, as compiled graphs issue it (compile/collectives.py)."""

    name: str  # the process group's collective it issues ("all_reduce", ...)
    coalesced: bool = False  # takes and returns a list of tensors
    mergeable: bool = False  # calls on one group and dtype may merge into one bucket


def collective(op: torch._ops.OpOverload, name: str, *, coalesced: bool = False, mergeable: bool = False):
    """Register `op` as a start of collective `name`, and `fn` (the op's arguments, the group name
    last and ignored) as its value inside an SPMD program."""
    record(op).collective = Collective(name, coalesced, mergeable)

    def register(fn):
        record(op).spmd = fn
        return fn
    return register


_REDUCERS = {"sum": jax.lax.psum, "avg": jax.lax.pmean, "max": jax.lax.pmax, "min": jax.lax.pmin}


def _reduce(x, op: str):
    reducer = _REDUCERS.get(op.lower())
    if reducer is None:
        raise NotImplementedError(f"reduce op {op!r} inside an XLA program")
    return reducer(x, AXIS)


def _reduce_scatter(x, op: str):
    out = jax.lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True)
    return out / jax.lax.psum(1, AXIS) if op.lower() == "avg" else out


def _all_to_all(x, output_splits, input_splits):
    if (output_splits and len(set(output_splits)) > 1) or (input_splits and len(set(input_splits)) > 1):
        raise NotImplementedError("uneven all_to_all_single inside an XLA program")
    return jax.lax.all_to_all(x, AXIS, 0, 0, tiled=True)


def _broadcast(x, src):
    return jax.lax.all_gather(x, AXIS)[src]


# functional collective -> its value inside the shard_map body (the group name, last, is dropped)
collective(_F.all_reduce.default, "all_reduce", mergeable=True)(lambda x, op, group: _reduce(x, op))
collective(_F.all_reduce_coalesced.default, "all_reduce", coalesced=True)(
    lambda xs, op, group: [_reduce(x, op) for x in xs])
collective(_F.all_gather_into_tensor.default, "all_gather", mergeable=True)(
    lambda x, n, group: jax.lax.all_gather(x, AXIS, axis=0, tiled=True))
collective(_F.all_gather_into_tensor_coalesced.default, "all_gather", coalesced=True)(
    lambda xs, n, group: [jax.lax.all_gather(x, AXIS, axis=0, tiled=True) for x in xs])
collective(_F.reduce_scatter_tensor.default, "reduce_scatter", mergeable=True)(
    lambda x, op, n, group: _reduce_scatter(x, op))
collective(_F.reduce_scatter_tensor_coalesced.default, "reduce_scatter", coalesced=True)(
    lambda xs, op, n, group: [_reduce_scatter(x, op) for x in xs])
collective(_F.all_to_all_single.default, "all_to_all")(lambda x, o, i, group: _all_to_all(x, o, i))
collective(_F.broadcast.default, "broadcast")(lambda x, src, group: _broadcast(x, src))
