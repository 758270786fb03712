"""Ops neuron refuses, each with an error that says what to use instead: never a crash, never a
silent trip through CPU.

Host-memory kernels: some ops' only kernel is PyTorch composite code that reads tensor memory on
the host (NNPACK, fbgemm, SobolEngine's state). A neuron tensor's data pointer is a handle inside
a PROT_NONE reservation, so such code kills the process. `python -m torchneuron.testing.crash_sweep`
finds them by calling every op whose neuron kernel is composite; each find gets an entry in
REFUSED, a kernel in REDIRECTED, or a lowering where the table already computes its work
(`_grid_sampler_2d_cpu_fallback` is `grid_sampler_2d`).

Quantized tensors: neuron has none (see docs/DESIGN.md). The ops that make one from a float
tensor are refused by name; anything else that asks for a quantized neuron tensor (`.to("neuron")`
of a quantized tensor, `torch.empty(..., dtype=torch.qint8, device="neuron")`, copies between a
quantized tensor and a neuron one) reaches the QuantizedPrivateUse1 fallback, which refuses with
the same advice.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten


class UnsupportedOpError(NotImplementedError):
    pass


_READS_HOST = "its only kernel reads tensor memory on the host"
_QUANTIZED_ADVICE = ("quantize and dequantize on CPU (q.dequantize().to('neuron') moves the values), or "
                     "simulate quantization with torch.ao.quantization's fake-quant ops "
                     "(torch.fake_quantize_per_tensor_affine, torch.fake_quantize_per_channel_affine), "
                     "which run on neuron")
# Op packet (every overload of it) -> why neuron refuses it and what to use instead.
REFUSED: dict[str, str] = {
    "aten::_nnpack_spatial_convolution": f"{_READS_HOST} (NNPACK is a CPU library); use "
                                         "torch.nn.functional.conv2d, which runs on neuron",
    "aten::_saturate_weight_to_fp16": f"{_READS_HOST} (an fbgemm helper); use "
                                      "weight.clamp(-65504, 65504), the float16 range",
    "aten::fbgemm_linear_quantize_weight": f"{_READS_HOST} (fbgemm is a CPU library); call it on CPU tensors",
    "aten::fbgemm_pack_gemm_matrix_fp16": f"{_READS_HOST} (fbgemm is a CPU library); call it on CPU tensors",
    "aten::choose_qparams_optimized": f"{_READS_HOST}; call it on a CPU tensor (x.cpu())",
    **{f"aten::_sobol_engine_{step}": f"{_READS_HOST}; torch.quasirandom.SobolEngine keeps its state on "
                                      "CPU: draw there and move the samples (engine.draw(n).to('neuron'))"
       for step in ("draw", "ff_", "scramble_", "initialize_state_")},
    **{f"aten::{name}": f"neuron has no quantized tensors; {_QUANTIZED_ADVICE}"
       for name in ("quantize_per_tensor", "quantize_per_tensor_dynamic", "quantize_per_channel",
                    "_make_per_tensor_quantized_tensor", "_make_per_channel_quantized_tensor")},
}


def _range_out_(start, end, *, out):
    # range.out_'s composite kernel calls CPU's range_out directly; range.out dispatches.
    return aten.range.out(start, end, 1, out=out)


# Overload -> a neuron kernel made of ops that dispatch (the composite one reads host memory).
REDIRECTED = {aten.range.out_: _range_out_}


def _refusal(name: str, reason: str):
    def kernel(*args, **kwargs):
        raise UnsupportedOpError(f"{name} is not supported on neuron: {reason}")

    kernel.__name__ = f"neuron_refuses_{name.partition('::')[2]}"
    return kernel


def _refuse_quantized(op, *args, **kwargs):
    dtype = kwargs.get("dtype") or next(
        (a.dtype for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.is_quantized), None)
    asked = f"{op.name()} got a {dtype} tensor for neuron" if dtype is not None else op.name()
    raise UnsupportedOpError(f"neuron has no quantized tensors ({asked}): {_QUANTIZED_ADVICE}")


def register(lib: torch.library.Library, fallback_lib: torch.library.Library) -> None:
    """Register the refusals and redirects as PrivateUse1 kernels, and the quantized refusal as
    the QuantizedPrivateUse1 fallback."""
    for name, reason in REFUSED.items():
        packet = getattr(aten, name.partition("::")[2])
        for overload in packet.overloads():
            op = getattr(packet, overload)
            lib.impl(op, _refusal(name, reason), "PrivateUse1")
    for op, kernel in REDIRECTED.items():
        lib.impl(op, kernel, "PrivateUse1")
    fallback_lib.fallback(_refuse_quantized, dispatch_key="QuantizedPrivateUse1")
