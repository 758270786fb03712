"""Result layouts for ops whose PyTorch meta kernel is missing or encodes a CUDA-only restriction.

The driver learns result shapes, dtypes and errors from PyTorch's meta kernels. A few of those
check what CUDA's kernel supports rather than what the op means; neuron behaves like CPU there.
Each override takes the meta arguments and returns the meta result.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten


def _grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    # CUDA's kernel takes bfloat16 only; CPU's (and ours) any floating type.
    low = torch.bfloat16
    out = aten._grouped_mm.default(mat_a.to(low), mat_b.to(low), offs,
                                   None if bias is None else bias.to(low), None)
    return out.to(out_dtype or mat_a.dtype)


def _geqrf(A):
    # PyTorch has no meta kernel for geqrf; LAPACK's result is column-major, as on CPU.
    *batch, m, n = A.shape
    a = torch.empty((*batch, n, m), dtype=A.dtype, device="meta").mT
    return a, torch.empty((*batch, min(m, n)), dtype=A.dtype, device="meta")


META_OVERRIDES = {
    aten._grouped_mm.default: _grouped_mm,
    aten.geqrf.default: _geqrf,
}
