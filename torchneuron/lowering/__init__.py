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
result dtype after, exactly as torch._refs does. `meta=` gives the op's meta function where
PyTorch's is missing or follows CUDA (the eager driver reads all of them from META_OVERRIDES).
Half-precision math upcasts with `opmath(x)` (float16/bfloat16 to float32), as PyTorch's CPU
kernels do, and rounds once at the end.
"""
from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping

import jax.numpy as jnp
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND

from .records import NO_RECORD, RECORDS, Facet, OpRecord, overloads, record, record_of  # noqa: F401  (the package's API)

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
    # takes key=, a PRNG key from the device generator; or a predicate on the op's arguments by name
    # (SDPA draws only with dropout): `draws_random` decides per call
    random: bool | Callable[..., bool] = False
    # For graphs only, where views, allocations and copies are values: eager mode does them as
    # metadata (views) or storage work (empty, copy_, _to_copy) and registers no kernel for them.
    graph_only: bool = False
    # Tensor arguments whose memory layout PyTorch's result depends on (det factors A^T when A is
    # contiguous, and its backward relies on that): drivers pass `<name>_contiguous=bool`.
    contiguity: tuple[str, ...] = ()
    # Tensor arguments whose storage layout the op reads (as_strided addresses the storage, not the
    # values): drivers pass `<name>_layout=(strides, storage_offset)`.
    strided: tuple[str, ...] = ()
    # Results whose shapes follow the device's convention (embedding_bag's auxiliary outputs differ
    # between CPU and CUDA): drivers pass `result_shapes=`, the shapes the meta kernel (eager: ours,
    # as on CPU) or the traced graph recorded.
    result_shapes: bool = False
    # The op's meta function where PyTorch's is missing or encodes a CUDA-only restriction (neuron
    # behaves like CPU): takes the meta arguments, returns the meta result.
    meta: Callable | None = None
    # Makes device-side checks (lowering/asserts.py): drivers thread the device's failure word
    # through its executables.
    checks: bool = False
    # A user's function (torchneuron.jax_op): torchneuron's code hash does not cover it, so its eager
    # programs are not kept in the persistent cache.
    user_code: bool = False
    # `float` arguments traced like Scalars rather than compiled per value: a learning rate that a
    # schedule changes every step must not compile the optimizer's program every step.
    traced: tuple[str, ...] = ()


def draws_random(lowering: Lowering, op: torch._ops.OpOverload, args, kwargs) -> bool:
    """Whether a call of `op` with these arguments (tensors may be placeholders) takes a PRNG key."""
    if not callable(lowering.random):
        return lowering.random
    named = dict(zip((a.name for a in op._schema.arguments), args))
    named.update(kwargs)
    return bool(lowering.random(**named))


# The lowered ops and their Lowerings, and the meta overrides: views of the records (records.py).
LOWERINGS: Mapping[torch._ops.OpOverload, Lowering] = Facet("lowering")
META_OVERRIDES: Mapping[torch._ops.OpOverload, Callable] = Facet("meta")


def lowers(*ops: torch._ops.OpOverload, **options) -> Callable:
    """Register `fn` as the lowering of each of `ops`."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            if record(op).lowering is not None:
                raise ValueError(f"{op} is lowered twice")
            record(op).lowering = lowering = Lowering(fn, **options)
            if lowering.meta is not None:
                overrides_meta(op)(lowering.meta)
        return fn

    return register


def overrides_meta(*ops: torch._ops.OpOverload) -> Callable:
    """Register `meta` as the meta function of each of `ops`; for ops the table computes through
    another overload (a mutating op through its lowered functional), whose meta differs."""

    def register(meta: Callable) -> Callable:
        for op in ops:
            if record(op).meta is not None:
                raise ValueError(f"{op} has two meta overrides")
            record(op).meta = meta
        return meta

    return register


class KernelRefusal(NotImplementedError):
    """A dtype no kernel of the op is built for: a NotImplementedError, as PyTorch's dispatch
    raises it."""


def refuses(check: Callable, *ops: torch._ops.OpOverload) -> None:
    """Run `check` on the arguments of each call of `ops` (the call's tensors, or meta tensors of
    their shapes) before its meta function: what CPU's and CUDA's kernels refuse that PyTorch's meta
    function accepts (the rules are in refusals.py and beside the ops). Every overload that takes
    the rule is named (out= ones too): the drivers run the rules of the overload called."""
    for op in ops:
        record(op).refusals.append(check)


def argument_rule(*ops: torch._ops.OpOverload) -> Callable:
    """`refuses` as a decorator, for a rule written beside the op's lowering:

        @argument_rule(aten.index_add.default, aten.index_add_.default, aten.index_add.out)
        def _index_add_dtypes(self, dim, index, source, *, alpha=1, out=None): ...
    """

    def register(check: Callable) -> Callable:
        refuses(check, *ops)
        return check

    return register


def check_refusals(op, args, kwargs) -> None:
    """Raise what CPU's kernel would for this call, if it refuses it."""
    found = RECORDS.get(op)
    if found is not None:
        for check in found.refusals:
            check(*args, **kwargs)


def run_meta(op, args, kwargs):
    """The op's meta result for these (meta) arguments: its refusals first, then its meta function
    (the record's, else PyTorch's)."""
    found = RECORDS.get(op)
    if found is None:
        return op(*args, **kwargs)
    for check in found.refusals:
        check(*args, **kwargs)
    return (found.meta or op)(*args, **kwargs)


def sizes_from(*ops: torch._ops.OpOverload) -> Callable:
    """Register `rule(*args, **kwargs)` as the results' true sizes of each of `ops` (a tensor's as a
    shape tuple), or None to ask the meta kernel: for ops whose meta kernel is slow Python and whose
    size rule is plain. Only sizes: every other property of a call is fixed by the plan it runs."""

    def register(rule: Callable) -> Callable:
        for op in ops:
            record(op).true_shapes = rule
        return rule

    return register


def takes_host_operands(names: tuple[str, ...], *ops: torch._ops.OpOverload) -> None:
    """Arguments of `ops` whose CPU tensors the op takes as CUDA does: moved to the call's device."""
    for op in ops:
        record(op).host_operands = names


def runs_as(target: torch._ops.OpOverload, *ops: torch._ops.OpOverload) -> None:
    """Calls of `ops` (per-list values as a 1-D CPU tensor) run as `target`, the ScalarList overload
    the table lowers: PyTorch's own kernels read such a tensor on the host too."""
    for op in ops:
        record(op).runs_as = target


def functional_of(inplace: torch._ops.OpOverload, functional: torch._ops.OpOverload) -> None:
    """`functional` computes what in-place `inplace` writes, where dropping the trailing underscore
    does not find it (normal_ -> normal_functional; the fused optimizers' lists)."""
    record(inplace).functional = functional


def out_from_functional(out: torch._ops.OpOverload, functional: torch._ops.OpOverload) -> None:
    """The out= overload `out` runs `functional` (which has its own neuron kernel, not the table's)
    and fills its outs."""
    record(out).out_from = functional


def refused(reason: str, *targets: torch._ops.OpOverloadPacket | torch._ops.OpOverload) -> None:
    """Neuron refuses each overload `targets` names (a packet: every overload of it), with `reason`
    (what to use instead)."""
    for target in targets:
        for op in overloads(target) if isinstance(target, torch._ops.OpOverloadPacket) else (target,):
            record(op).refused = reason


def redirected(kernel: Callable, *ops: torch._ops.OpOverload) -> None:
    """`kernel` is the neuron kernel of `ops`, made of ops that dispatch (their composite kernel
    reads host memory)."""
    for op in ops:
        record(op).redirect = kernel


def sparse_kernel(*ops: torch._ops.OpOverload) -> Callable:
    """Register `kernel` as the SparsePrivateUse1 kernel of each of `ops`: what the op does to sparse COO
    neuron tensors, made of dense ops that dispatch (torchneuron/sparse/ registers it)."""

    def register(kernel: Callable) -> Callable:
        for op in ops:
            if record(op).sparse is not None:
                raise ValueError(f"{op} has two sparse kernels")
            record(op).sparse = kernel
        return kernel

    return register


_HALF = (jnp.float16, jnp.bfloat16)


def opmath_dtype(dtype) -> type | None:
    """The dtype PyTorch's CPU kernels compute `dtype` in, their "opmath" type: float32 for float16
    and bfloat16, which then round once at the end; None for the rest (they compute in themselves)."""
    return jnp.float32 if dtype in _HALF else None


def opmath(x):
    """Array `x` (or None) in its opmath dtype.

        opmath(jnp.ones(2, jnp.bfloat16)).dtype  # float32
    """
    return x.astype(jnp.float32) if x is not None and x.dtype in _HALF else x


FAMILIES = ("elementwise", "reductions", "shape", "indexing", "linalg", "nn", "factories", "random", "foreach",
            "views", "histograms", "sampling", "pooling", "activations", "fft", "polynomials", "special",
            "embedding_bag", "ctc", "amp", "fake_quant", "low_precision", "attention", "flex_attention", "optimizers",
            "assertions", "unsupported", "refusals", "collectives", "nested")


def load_all() -> dict:
    for family in FAMILIES:
        importlib.import_module(f"{__name__}.{family}")
    return LOWERINGS
