"""No op kills the process: the ops the crash sweep found run or raise, in a spawned worker, and
(slow) a full sweep over every op whose neuron kernel is composite finds nothing new."""

import pytest
import torch

import torchneuron  # noqa: F401 (registers the device)
from torchneuron.testing import crash_sweep

slow = pytest.mark.slow

# What `python -m torchneuron.testing.crash_sweep` found (torch 2.13): each killed the process
# before it got a lowering, a redirect or a refusal (torchneuron/eager/unsupported.py).
FOUND = [
    "aten::_grid_sampler_2d_cpu_fallback",
    "aten::_grid_sampler_2d_cpu_fallback.out",
    "aten::_grid_sampler_2d_cpu_fallback_backward",
    "aten::_nnpack_spatial_convolution",
    "aten::_saturate_weight_to_fp16",
    "aten::_sobol_engine_draw",
    "aten::_sobol_engine_ff_",
    "aten::_sobol_engine_initialize_state_",
    "aten::choose_qparams_optimized",
    "aten::fbgemm_linear_quantize_weight",
    "aten::fbgemm_pack_gemm_matrix_fp16",
    "aten::range.out_",
]
# The sweep's arguments kill these on CPU as well: the arguments' fault, not neuron's (each has a
# test with valid arguments in tests/eager/test_unsupported.py).
CRASH_ON_CPU_TOO = {"aten::_thnn_differentiable_gru_cell_backward"}


def test_candidates_are_composite_kernels_not_ours():
    names = crash_sweep.candidates()
    assert "aten::flatten.using_ints" in names  # CompositeImplicitAutograd
    assert "aten::add.Tensor" not in names  # lowered: our kernel
    assert not set(FOUND) & set(names)  # each now has a kernel of ours
    assert crash_sweep.slot_of("aten::add.Tensor") == "kernel"


def test_arguments_follow_the_schema():
    op = torch.ops.aten._grid_sampler_2d_cpu_fallback.default
    args, kwargs = crash_sweep.arguments(op, torch.float32, (1, 1, 2, 2), device="cpu")
    assert [type(a) for a in args] == [torch.Tensor, torch.Tensor, int, int, bool] and not kwargs
    out_args, out_kwargs = crash_sweep.arguments(torch.ops.aten.range.out_, torch.float32, (2,), device="cpu")
    assert out_args == [1, 1] and set(out_kwargs) == {"out"}


def test_the_found_ops_no_longer_crash():
    outcomes = dict(crash_sweep.sweep(FOUND))
    crashed = {name: outcome for name, outcome in outcomes.items() if crash_sweep.is_find(outcome)}
    assert not crashed
    refused = [name for name, outcome in outcomes.items() if "UnsupportedOpError" in outcome]
    assert len(refused) == 8 and "aten::range.out_" not in refused


@slow
def test_no_composite_kernel_crashes_the_process():
    finds = {name: outcome for name, outcome in crash_sweep.sweep(crash_sweep.candidates())
             if crash_sweep.is_find(outcome)}
    assert set(finds) <= CRASH_ON_CPU_TOO, finds
