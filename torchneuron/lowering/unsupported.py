"""Ops neuron refuses, each with what to use instead, and ops whose neuron kernel is a redirect.

Some ops' only kernel is PyTorch composite code that reads tensor memory on the host (NNPACK,
fbgemm, SobolEngine's state); a neuron tensor's data pointer is a handle inside a PROT_NONE
reservation, so such code would kill the process. `python -m torchneuron.testing.crash_sweep` finds
them; each find is refused here, redirected here, or lowered where the table already computes its
work. The eager driver registers a kernel for each (eager/unsupported.py).
"""
from __future__ import annotations

from . import aten, redirected, refused

_READS_HOST = "its only kernel reads tensor memory on the host"
QUANTIZED_ADVICE = ("quantize and dequantize on CPU (q.dequantize().to('neuron') moves the values), or "
                    "simulate quantization with torch.ao.quantization's fake-quant ops "
                    "(torch.fake_quantize_per_tensor_affine, torch.fake_quantize_per_channel_affine), "
                    "which run on neuron")

refused(f"{_READS_HOST} (NNPACK is a CPU library); use torch.nn.functional.conv2d, which runs on neuron",
        aten._nnpack_spatial_convolution)
refused(f"{_READS_HOST} (an fbgemm helper); use weight.clamp(-65504, 65504), the float16 range",
        aten._saturate_weight_to_fp16)
refused(f"{_READS_HOST} (fbgemm is a CPU library); call it on CPU tensors",
        aten.fbgemm_linear_quantize_weight, aten.fbgemm_pack_gemm_matrix_fp16)
refused(f"{_READS_HOST}; call it on a CPU tensor (x.cpu())", aten.choose_qparams_optimized)
refused(f"{_READS_HOST}; torch.quasirandom.SobolEngine keeps its state on CPU: draw there and move the "
        "samples (engine.draw(n).to('neuron'))",
        aten._sobol_engine_draw, aten._sobol_engine_ff_, aten._sobol_engine_scramble_,
        aten._sobol_engine_initialize_state_)
refused(f"neuron has no quantized tensors; {QUANTIZED_ADVICE}",
        aten.quantize_per_tensor, aten.quantize_per_tensor_dynamic, aten.quantize_per_channel,
        aten._make_per_tensor_quantized_tensor, aten._make_per_channel_quantized_tensor)


def _range_out_(start, end, *, out):
    # range.out_'s composite kernel calls CPU's range_out directly; range.out dispatches.
    return aten.range.out(start, end, 1, out=out)


redirected(_range_out_, aten.range.out_)
