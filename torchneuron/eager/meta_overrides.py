"""Result layouts for ops whose PyTorch meta kernel encodes a CUDA-only restriction.

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


META_OVERRIDES = {
    aten._grouped_mm.default: _grouped_mm,
}
