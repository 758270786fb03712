"""Lowerings of other libraries' custom ops, registered when the library defines them.

transformers' MoE experts call `transformers::grouped_mm_fallback` (and its backward op) where
`_grouped_mm` is unavailable, for example with float32 weights: a Python loop of matmuls over the
experts with one host sync. Lowered, a compiled MoE graph stays one XLA program (it ran op by op)
and eager runs one executable. If transformers renames the ops, nothing is registered and they run
as transformers wrote them.
"""
from __future__ import annotations

import torch

from .eager import kernels
from .lowering import LOWERINGS, linalg, lowers

TRANSFORMERS_MOE = {
    "grouped_mm_fallback": linalg.grouped_rows_mm,
    "grouped_mm_fallback_backward": linalg.grouped_rows_mm_backward,
}


def lower_transformers_moe(module=None) -> None:
    """Register the lowerings and neuron kernels of transformers' MoE ops (once they exist)."""
    del module  # (called once transformers.integrations.moe has run)
    ops = getattr(torch.ops, "transformers", None)
    for name, fn in TRANSFORMERS_MOE.items():
        packet = getattr(ops, name, None) if ops is not None else None
        if packet is None or packet.default in LOWERINGS:
            continue
        lowers(packet.default)(fn)
        kernels.register_kernel(packet.default)
