"""THE lowering table: one entry per ATen overload, a pure function of JAX arrays.

A lowering receives the op's arguments as the dispatcher passes them (schema order,
keyword-only ones as keywords) with tensors replaced by JAX arrays and Scalar arguments by
0-d arrays (traced, so new values never recompile). It returns arrays, nothing else: no
storages, views, in-place writes or output dtypes; the eager and compile drivers do those.

    @lowers(aten.add.Tensor, aten.add.Scalar, promote=DEFAULT)
    def add(self, other, alpha=1):
        return self + other * alpha

`promote` names PyTorch's type-promotion kind: the driver casts the `promote_args` (and any
other traced scalars) to PyTorch's computation dtype first, and the result to PyTorch's
result dtype after, exactly as torch._refs does.
"""
from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND

aten = torch.ops.aten
DEFAULT = KIND.DEFAULT
INT_TO_FLOAT = KIND.INT_TO_FLOAT
ALWAYS_BOOL = KIND.ALWAYS_BOOL
COMPLEX_TO_FLOAT = KIND.COMPLEX_TO_FLOAT
BOOL_TO_LONG = KIND.BOOL_TO_LONG
NO_OPMATH = KIND.NO_OPMATH


@dataclasses.dataclass(frozen=True)
class Lowering:
    fn: Callable
    promote: KIND | None = None
    promote_args: tuple[str, ...] = ("self", "other")
    static_scalars: bool = False  # Scalars shape the result (arange): compile per value
    data_dependent: bool = False  # output shape depends on values: run outside jit
    random: bool = False  # takes key=, a PRNG key from the device generator
    graph_only: bool = False  # a view as a value: for graphs; eager keeps views as metadata
    # Tensor arguments whose memory layout PyTorch's result depends on (det factors A^T when A is
    # contiguous, and its backward relies on that): drivers pass `<name>_contiguous=bool`.
    contiguity: tuple[str, ...] = ()
    # Results whose shapes follow the device's convention (embedding_bag's auxiliary outputs differ
    # between CPU and CUDA): drivers pass `result_shapes=`, the shapes the meta kernel (eager: ours,
    # as on CPU) or the traced graph recorded.
    result_shapes: bool = False


LOWERINGS: dict[torch._ops.OpOverload, Lowering] = {}


def lowers(*ops: torch._ops.OpOverload, **options) -> Callable:
    """Register `fn` as the lowering of each of `ops`."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"{op} is lowered twice")
            LOWERINGS[op] = Lowering(fn, **options)
        return fn

    return register


FAMILIES = ("elementwise", "reductions", "shape", "indexing", "linalg", "nn", "factories", "random", "foreach",
            "views", "extra", "sampling", "pooling", "activations", "fft", "polynomials", "special",
            "embedding_bag", "ctc", "fake_quant")


def load_all() -> dict:
    for family in FAMILIES:
        importlib.import_module(f"{__name__}.{family}")
    return LOWERINGS
