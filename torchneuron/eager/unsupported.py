"""Ops neuron refuses, each with an error that says what to use instead: never a crash, never a
silent trip through CPU.

Host-memory kernels: some ops' only kernel is PyTorch composite code that reads tensor memory on
the host (NNPACK, fbgemm, SobolEngine's state). A neuron tensor's data pointer is a handle inside
a PROT_NONE reservation, so such code kills the process. `python -m torchneuron.testing.crash_sweep`
finds them by calling every op whose neuron kernel is composite; each find is refused or
redirected in lowering/unsupported.py (its record's `refused` or `redirect`), or lowered where the
table already computes its work (`_grid_sampler_2d_cpu_fallback` is `grid_sampler_2d`).

Quantized tensors: neuron has none (see docs/DESIGN.md). The ops that make one from a float
tensor are refused by name; anything else that asks for a quantized neuron tensor (`.to("neuron")`
of a quantized tensor, `torch.empty(..., dtype=torch.qint8, device="neuron")`, copies between a
quantized tensor and a neuron one) reaches the QuantizedPrivateUse1 fallback, which refuses with
the same advice.
"""
from __future__ import annotations

import torch

from ..lowering import RECORDS
from ..lowering.unsupported import QUANTIZED_ADVICE

aten = torch.ops.aten


class UnsupportedOpError(NotImplementedError):
    pass


def _refusal(name: str, reason: str):
    def kernel(*args, **kwargs):
        raise UnsupportedOpError(f"{name} is not supported on neuron: {reason}")

    kernel.__name__ = f"neuron_refuses_{name.partition('::')[2]}"
    return kernel


def _refuse_quantized(op, *args, **kwargs):
    dtype = kwargs.get("dtype") or next(
        (a.dtype for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.is_quantized), None)
    asked = f"{op.name()} got a {dtype} tensor for neuron" if dtype is not None else op.name()
    raise UnsupportedOpError(f"neuron has no quantized tensors ({asked}): {QUANTIZED_ADVICE}")


def register(lib: torch.library.Library, fallback_lib: torch.library.Library) -> None:
    """Register the refused ops (their records' `refused`) as PrivateUse1 kernels that say why,
    and the quantized refusal as the QuantizedPrivateUse1 fallback."""
    for found in list(RECORDS.values()):
        if found.refused is not None:
            lib.impl(found.op, _refusal(found.op._schema.name, found.refused), "PrivateUse1")
    fallback_lib.fallback(_refuse_quantized, dispatch_key="QuantizedPrivateUse1")
