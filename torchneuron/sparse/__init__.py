"""Sparse tensors on neuron: COO tensors whose indices and values are dense neuron tensors.

PyTorch sends an op on a COO neuron tensor to the SparsePrivateUse1 dispatch key. ATen's
device-agnostic COO kernels are registered for it in C++ (csrc/sparse_coo.cpp); the kernels CPU
and CUDA each implement on their own are Python compositions of dense neuron ops (coo.py), each
on its op's record (`sparse_kernel`), registered here. Anything else a sparse neuron tensor meets,
and every op on the compressed layouts (CSR, CSC, BSR, BSC), raises an error that names the op and
the layout: a sparse tensor never reaches the dense CPU fallback. docs/SPARSE.md lists what runs.
"""
from __future__ import annotations

import torch

from ..lowering import RECORDS, refused
from . import coo, gradients  # noqa: F401  (fill the records: sparse kernels, redirects)

aten = torch.ops.aten
_lib = torch.library.Library("aten", "IMPL")
_fallback_lib = torch.library.Library("_", "IMPL")

_COMPRESSED = "neuron has sparse COO tensors only (docs/SPARSE.md); convert with x.to_sparse() or run it on CPU"

# Dense neuron tensors converted to a compressed layout: refused by name, before the CPU fallback
# could take them.
refused(f"layout torch.sparse_csr: {_COMPRESSED}", aten._to_sparse_csr)
refused(f"layout torch.sparse_csc: {_COMPRESSED}", aten._to_sparse_csc)
refused(f"layout torch.sparse_bsr: {_COMPRESSED}", aten._to_sparse_bsr)
refused(f"layout torch.sparse_bsc: {_COMPRESSED}", aten._to_sparse_bsc)


class SparseUnsupportedError(NotImplementedError):
    pass


def _layout_of(args, kwargs) -> torch.layout | None:
    """The sparse layout the call involves: a sparse tensor's, or a factory's `layout=`."""
    for a in (*args, *kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            layout = t.layout if isinstance(t, torch.Tensor) else t if isinstance(t, torch.layout) else None
            if layout is not None and layout != torch.strided:
                return layout
    return None


def _refuse(op, *args, **kwargs):
    layout = _layout_of(args, kwargs)
    advice = ("see docs/SPARSE.md for the sparse COO ops neuron runs; x.to_dense() gives a dense tensor"
              if layout == torch.sparse_coo else _COMPRESSED)
    raise SparseUnsupportedError(f"{op.name()} is not supported on neuron for layout {layout}: {advice}")


def install() -> None:
    """Register the records' sparse kernels and the refusing fallbacks of the sparse keys."""
    for found in list(RECORDS.values()):
        if found.sparse is not None:
            _lib.impl(found.op, found.sparse, "SparsePrivateUse1")
    for key in ("SparsePrivateUse1", "SparseCsrPrivateUse1"):
        _fallback_lib.fallback(_refuse, dispatch_key=key)
