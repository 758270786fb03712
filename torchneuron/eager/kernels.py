"""Registers the eager driver with the dispatcher.

- every op of the lowering table, with its in-place and out= variants, gets a PrivateUse1
  kernel that runs the driver;
- copies and `.item()` get their own kernels (they cross the host/device boundary);
- ops neuron refuses (their only kernel reads host memory; quantized tensors) get kernels that say
  so and what to use instead (unsupported.py);
- everything else reaches one boxed fallback that, in order, aliases views through their
  meta kernel, runs PyTorch's decomposition on the device, or runs on CPU counted.
"""
from __future__ import annotations

import torch

from ..lowering import LOWERINGS, RECORDS
from . import copies, driver, fallback, unsupported
from .dynamo_skip import skip_recursively
from .execute import fill_outs
from .schema import inplace_packets, parse

aten = torch.ops.aten
_lib = torch.library.Library("aten", "IMPL")
_fallback_lib = torch.library.Library("_", "IMPL")
# namespace -> the Library the neuron kernels of its ops go through (kept alive here: its registrations
# last as long as it does)
_LIBRARIES: dict[str, torch.library.Library] = {"aten": _lib}


def _has_kernel(op, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)


def make_kernel(op):
    schema = parse(op)
    plans = driver.plans_of(op)
    run = driver.run

    def kernel(*args, **kwargs):
        return run(schema, plans, args, kwargs)

    kernel.__name__ = f"neuron_{op.name()}"
    return kernel


def register_kernel(op) -> None:
    """Register the driver's neuron kernel for `op`, an overload of any namespace (jax_op's custom ops,
    transformers' ops)."""
    library = _LIBRARIES.get(op.namespace)
    if library is None:
        library = _LIBRARIES[op.namespace] = torch.library.Library(op.namespace, "IMPL")
    library.impl(op, make_kernel(op), "PrivateUse1")


def variants(functional) -> list:
    """`functional` and the overloads whose values it computes (in-place, out=)."""
    name = functional._schema.name.split("::")[1]
    found = [functional]
    # a `_foo_functional` lowering also computes the mutating `_foo` (e.g. _native_batch_norm_legit)
    mutating = (name.removesuffix("_functional"),) if name.endswith("_functional") else ()
    for packet_name in (name, name + "_", *inplace_packets(name), *mutating):
        packet = getattr(aten, packet_name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if op is not functional and parse(op).functional is functional:
                found.append(op)
    return found


def _should_register(op) -> bool:
    if _has_kernel(op, "PrivateUse1") or parse(op).view:
        return False  # views stay metadata in eager mode; their lowerings serve graphs
    # A backend kernel would hide a CompositeImplicitAutograd op's decomposition from autograd.
    return not _has_kernel(op, "CompositeImplicitAutograd")


REGISTERED: list = []

def _out_from_functional(op, functional):
    out_names = [op._schema.arguments[i].name for i in parse(op).out_args]

    def kernel(*args, **kwargs):
        outs = [kwargs.pop(name) for name in out_names]
        results = functional(*args, **kwargs)
        return fill_outs(outs, results if isinstance(results, tuple) else (results,), op)
    return kernel


def _polygamma_(self, n):
    # In-place polygamma takes (self, n), its functional (n, self): no schema-derived variant.
    result = aten.polygamma.default(n, self)
    if not torch.can_cast(result.dtype, self.dtype):
        raise RuntimeError(f"result type {result.dtype} can't be cast to the desired output type {self.dtype}")
    return self.copy_(result)


def _equal(self, other):
    """torch.equal returns a Python bool: same shape and every element equal, computed on device."""
    if self.shape != other.shape:
        return False
    return bool(aten.all.default(aten.eq.Tensor(self, other)).item())


def _record_stream(self, stream):
    """Nothing to do: work on a NeuronCore runs in issue order whatever its stream, so a storage is
    never reused before the work queued on it (DDP records the streams of the inputs it moves)."""


def _as_scalar_list(target):
    def kernel(self, tensor1, tensor2, scalars):
        if scalars.device.type != "cpu" or scalars.dim() != 1:
            raise RuntimeError(f"{target}: scalars must be a 1-D CPU tensor, got {scalars.dim()}-D "
                               f"on {scalars.device}")
        return target(self, tensor1, tensor2, scalars.tolist())
    return kernel


def register_all() -> None:
    # Copies and .item() first: they cross the host/device boundary, not the driver.
    _lib.impl(aten.copy_.default, copies.copy_, "PrivateUse1")
    _lib.impl(aten._copy_from.default, copies.copy_from, "PrivateUse1")
    _lib.impl(aten._local_scalar_dense.default, copies.local_scalar_dense, "PrivateUse1")
    _lib.impl(aten.equal.default, _equal, "PrivateUse1")
    _lib.impl(aten.polygamma_.default, _polygamma_, "PrivateUse1")
    _lib.impl(aten.record_stream.default, _record_stream, "PrivateUse1")
    # Records whose kernel is not the driver's: redirects, out= from a functional's own kernel,
    # CPU tensors of per-list scalars (first: the table's loop skips ops that have a kernel).
    for found in list(RECORDS.values()):
        if found.redirect is not None:
            _lib.impl(found.op, found.redirect, "PrivateUse1")
        elif found.out_from is not None:
            _lib.impl(found.op, _out_from_functional(found.op, found.out_from), "PrivateUse1")
        elif found.runs_as is not None:
            _lib.impl(found.op, _as_scalar_list(found.runs_as), "PrivateUse1")
    for functional, lowering in list(LOWERINGS.items()):
        if lowering.graph_only:
            continue
        for op in variants(functional):
            if _should_register(op):
                _lib.impl(op, make_kernel(op), "PrivateUse1")
                REGISTERED.append(op)
    unsupported.register(_lib, _fallback_lib)  # refusals, the quantized fallback
    _fallback_lib.fallback(fallback.dispatch, dispatch_key="PrivateUse1")
    skip_recursively(make_kernel(aten.add.Tensor), copies.copy_, copies.copy_from,
                     copies.local_scalar_dense, fallback.dispatch, driver.run_op)
