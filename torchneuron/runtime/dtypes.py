"""torch dtype <-> JAX dtype, in one table."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import torch

TORCH_TO_JAX = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int8: jnp.int8,
    torch.int16: jnp.int16,
    torch.int32: jnp.int32,
    torch.int64: jnp.int64,
    torch.uint8: jnp.uint8,
    torch.uint16: jnp.uint16,
    torch.uint32: jnp.uint32,
    torch.uint64: jnp.uint64,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex128,
    torch.float8_e4m3fn: jnp.float8_e4m3fn,
    torch.float8_e5m2: jnp.float8_e5m2,
    torch.float8_e4m3fnuz: jnp.float8_e4m3fnuz,
    torch.float8_e5m2fnuz: jnp.float8_e5m2fnuz,
    torch.float8_e8m0fnu: jnp.float8_e8m0fnu,
}
# float8 formats: PyTorch converts to and from them through float32 with its own rules for overflow
# and NaN (lowering/low_precision.py), not XLA's.
FLOAT8 = frozenset(d for d in TORCH_TO_JAX if d.is_floating_point and d.itemsize == 1)
JAX_TO_TORCH = {np.dtype(v): k for k, v in TORCH_TO_JAX.items()}

# Python numbers as numpy scalars of the dtype PyTorch gives them: they reach jitted code faster
# than Python numbers, and never as JAX's weak types.
PYTHON_SCALAR_TYPES = {float: np.float64, int: np.int64, bool: np.bool_, complex: np.complex128}

# The numpy scalar of each Python float and int an op has met (up to HOST_SCALAR_MEMO_SIZE per
# type): a loop's constants (`x * 1.001`) are converted once, and fused eager tells equal scalars
# apart by HOST_SCALAR_IDENTS instead of reading their bytes per op. Values whose equality hides
# their bits (0.0 and -0.0; NaN, equal to nothing) are converted each time.
HOST_SCALAR_MEMO_SIZE = 4096
_HOST_SCALAR_MEMOS: dict = {float: {}, int: {}}
# id of a memoized numpy scalar (held by its memo for the process: the id stays its) -> (dtype, bytes)
HOST_SCALAR_IDENTS: dict = {}


def host_scalar(value):
    """`value` (a Python number, or anything numpy takes) as the numpy scalar or array a jitted
    call takes: PYTHON_SCALAR_TYPES' type for Python numbers."""
    kind = type(value)
    memo = _HOST_SCALAR_MEMOS.get(kind)
    if memo is not None:
        found = memo.get(value)
        if found is not None:
            return found
    scalar = PYTHON_SCALAR_TYPES.get(kind, np.asarray)(value)
    if memo is not None and value and not (kind is float and math.isnan(value)) and len(memo) < HOST_SCALAR_MEMO_SIZE:
        memo[value] = scalar
        HOST_SCALAR_IDENTS[id(scalar)] = (scalar.dtype, scalar.tobytes())
    return scalar


# CPU's acc_type where it is wider than the computation dtype (at::acc_type<T, false>): some CPU
# kernels (scans, the zeta series) accumulate in it, and matching them needs the same width.
CPU_ACC_TYPE = {np.dtype(jnp.float32): jnp.float64, np.dtype(jnp.complex64): jnp.complex128}


# Why a torch dtype has no device type, and what to use instead.
UNSUPPORTED = {
    torch.complex32: "XLA has no complex32 type; use complex64 (`tensor.cfloat()`)",
}


class UnsupportedDtypeError(TypeError):
    """A torch dtype that neuron tensors cannot hold; `where` names the op or copy when known."""

    def __init__(self, dtype: torch.dtype, where: str = ""):
        self.dtype = dtype
        hint = UNSUPPORTED.get(dtype, "no XLA type holds it")
        super().__init__(f"neuron{': ' + where if where else ''} does not support dtype {dtype}: {hint}")


def scalar_type_name(dtype: torch.dtype) -> str:
    """c10's name of a dtype (Float, Long, ComplexFloat), as PyTorch's kernels spell it in errors."""
    return torch.empty(0, dtype=dtype, device="meta").type().removeprefix("torch.meta.").removesuffix("Tensor")


def to_jax(dtype: torch.dtype):
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        raise UnsupportedDtypeError(dtype) from None


def to_torch(dtype) -> torch.dtype:
    return JAX_TO_TORCH[np.dtype(dtype)]
