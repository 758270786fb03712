"""Calling a lowering the same way from the eager and the compile drivers.

Both drivers know an op's arguments as JAX arrays (tensors), 0-d arrays or numbers (Scalars) and
static values; this module casts what the lowering declared (`promote`) to PyTorch's computation
dtype and calls it.
"""
from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
import torch
from torch._prims_common import elementwise_dtypes

from ..runtime.dtypes import PYTHON_SCALAR_TYPES, to_jax
from . import Lowering, asserts


class Kind(enum.Enum):
    TENSOR = 1  # Tensor or Tensor?
    TENSORS = 2  # Tensor[] or Tensor?[]
    SCALAR = 3  # Scalar or Scalar?: traced
    SCALARS = 4  # Scalar[]: traced
    STATIC = 5  # everything else: part of the compile key


def kind_of(arg: torch._C.Argument, traced: tuple[str, ...] = ()) -> Kind:
    """How a driver passes `arg`; `traced` names `float` arguments passed as Scalars (Lowering.traced)."""
    t = str(arg.type)
    if arg.name in traced and t in ("float", "Optional[float]"):
        return Kind.SCALAR
    if t in ("Tensor", "Optional[Tensor]"):
        return Kind.TENSOR
    if t in ("List[Tensor]", "List[Optional[Tensor]]"):
        return Kind.TENSORS
    if t in ("number", "Optional[number]"):
        return Kind.SCALAR
    if t == "List[number]":
        return Kind.SCALARS
    return Kind.STATIC




def compute_dtype(lowering: Lowering, names: list[str], args, kwargs):
    """PyTorch's computation dtype for a promoting lowering, from meta/fake tensors and numbers."""
    if lowering.promote is None:
        return None
    values = []
    for name in lowering.promote_args:
        if name not in names:
            continue
        i = names.index(name)
        v = args[i] if i < len(args) else kwargs.get(name)
        if v is None:
            continue
        if isinstance(v, torch.Tensor) and v.device.type not in ("meta",) and not _is_fake(v):
            v = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
        values.append(v)
    compute, _ = elementwise_dtypes(*values, type_promotion_kind=lowering.promote)
    return to_jax(compute)


def _is_fake(t) -> bool:
    return type(t).__name__ == "FakeTensor"


def static_flags(op, lowering: Lowering, args, kwargs, meta_result) -> dict:
    """The keyword arguments a lowering asks its driver for, from the tensors (or meta values) the
    driver holds: `<name>_contiguous` for its `contiguity` arguments, `<name>_layout` (strides,
    storage offset) for its `strided` ones, and `result_shapes=` (the
    shape of each result, or None) when it declares `result_shapes`."""
    names = [a.name for a in op._schema.arguments]
    flags = {}
    for name in lowering.contiguity:
        i = names.index(name)
        value = args[i] if i < len(args) else kwargs[name]
        flags[f"{name}_contiguous"] = bool(value.is_contiguous())
    for name in lowering.strided:
        i = names.index(name)
        value = args[i] if i < len(args) else kwargs[name]
        flags[f"{name}_layout"] = (tuple(value.stride()), value.storage_offset())
    if lowering.result_shapes:
        results = meta_result if isinstance(meta_result, (tuple, list)) else (meta_result,)
        flags["result_shapes"] = tuple(tuple(r.shape) if isinstance(r, torch.Tensor) else None for r in results)
    return flags


def invoke(op, lowering: Lowering, args, kwargs, compute=None, key=None, layout_flags=None) -> tuple:
    """Call `lowering` for functional overload `op`; returns a tuple with one entry per return."""
    schema_args = op._schema.arguments
    kinds = {a.name: kind_of(a, lowering.traced) for a in schema_args}
    names = [a.name for a in schema_args]
    promote = set(lowering.promote_args) if compute is not None else set()

    def prepare(name, value):
        kind = kinds.get(name, Kind.STATIC)
        if kind in (Kind.SCALAR, Kind.SCALARS) and not lowering.static_scalars:
            value = _as_array(value)
        cast = compute is not None and (name in promote or kind in (Kind.SCALAR, Kind.SCALARS))
        return _cast(value, compute) if cast else value

    call_args = [prepare(names[i] if i < len(names) else "", v) for i, v in enumerate(args)]
    call_kwargs = {k: prepare(k, v) for k, v in kwargs.items()}
    if key is not None:  # (the driver decided the call draws: lowering.draws_random)
        call_kwargs["key"] = key
    if layout_flags:
        call_kwargs.update(layout_flags)
    try:
        with asserts.op_scope(op):
            result = lowering.fn(*call_args, **call_kwargs)
    except Exception as e:
        dtypes = ", ".join(str(a.dtype) for a in jax.tree_util.tree_leaves(list(args)) if hasattr(a, "dtype"))
        raise type(e)(f"neuron: {op} failed for dtypes ({dtypes or 'no tensors'}): {e}") from e
    return tuple(result) if len(op._schema.returns) > 1 else (result,)


def _as_array(value):
    if isinstance(value, (list, tuple)):
        return [_as_array(v) for v in value]
    convert = PYTHON_SCALAR_TYPES.get(type(value))
    return jnp.asarray(convert(value)) if convert is not None else value


def _cast(value, dtype):
    if isinstance(value, list):
        return [_cast(v, dtype) for v in value]
    return value.astype(dtype) if hasattr(value, "astype") else value
