"""Ops neuron refuses say so by name and say what to do instead; the ops whose composite kernels
read host memory either compute on neuron as CPU does or are refused; quantized tensors are refused
at every entry point, never detoured through CPU."""
import pytest
import torch

from torchneuron.eager.unsupported import UnsupportedOpError
from torchneuron.lowering import RECORDS

aten = torch.ops.aten
QUANTIZED = "neuron has no quantized tensors"


def test_every_refused_and_redirected_overload_has_a_neuron_kernel():
    ops = [r.op for r in RECORDS.values() if r.refused is not None or r.redirect is not None]
    assert aten._nnpack_spatial_convolution.default in ops and aten.range.out_ in ops
    for op in ops:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1"), op


def test_a_refusal_names_the_op_and_the_way_out(no_fallback):
    x = torch.ones(1, 1, 3, 3, device="neuron")
    with pytest.raises(UnsupportedOpError, match=r"aten::_nnpack_spatial_convolution is not supported on neuron: "
                                                 r".*reads tensor memory on the host.*torch.nn.functional.conv2d"):
        aten._nnpack_spatial_convolution(x, x, None, [0, 0])
    engine = torch.quasirandom.SobolEngine(2)
    with pytest.raises(UnsupportedOpError, match=r"aten::_sobol_engine_draw .*draw\(n\)\.to\('neuron'\)"):
        aten._sobol_engine_draw(torch.zeros(1, 2, device="neuron"), 1, engine.sobolstate.to("neuron"),
                                2, 0, torch.float32)


@pytest.mark.parametrize("interpolation", [0, 1, 2])
@pytest.mark.parametrize("padding", [0, 1, 2])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sampler_cpu_fallback_computes_as_cpu(interpolation, padding, align_corners, lowered_only):
    x, grid = torch.randn(2, 3, 5, 4), torch.rand(2, 3, 4, 2) * 2.2 - 1.1
    expected = aten._grid_sampler_2d_cpu_fallback(x, grid, interpolation, padding, align_corners)
    got = aten._grid_sampler_2d_cpu_fallback(x.to("neuron"), grid.to("neuron"), interpolation, padding, align_corners)
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)


def test_grid_sampler_cpu_fallback_backward_and_out_as_cpu(lowered_only):
    x, grid = torch.randn(1, 2, 4, 4), torch.rand(1, 3, 3, 2) * 2 - 1
    grad = torch.randn(1, 2, 3, 3)
    expected = aten._grid_sampler_2d_cpu_fallback_backward(grad, x, grid, 0, 0, False)
    got = aten._grid_sampler_2d_cpu_fallback_backward(grad.to("neuron"), x.to("neuron"), grid.to("neuron"), 0, 0, False)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e, atol=1e-5, rtol=1e-5)
    out = torch.empty(0, device="neuron")
    aten._grid_sampler_2d_cpu_fallback.out(x.to("neuron"), grid.to("neuron"), 1, 1, True, out=out)
    torch.testing.assert_close(out.cpu(), aten._grid_sampler_2d_cpu_fallback(x, grid, 1, 1, True))
    leaf = x.to("neuron").requires_grad_()
    aten._grid_sampler_2d_cpu_fallback(leaf, grid.to("neuron"), 0, 0, False).sum().backward()
    cpu_leaf = x.clone().requires_grad_()
    aten._grid_sampler_2d_cpu_fallback(cpu_leaf, grid, 0, 0, False).sum().backward()
    torch.testing.assert_close(leaf.grad.cpu(), cpu_leaf.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:torch.range is deprecated")
def test_range_out_underscore_runs_as_range_out():
    out, expected = torch.empty(4, device="neuron"), torch.empty(4)
    aten.range.out_(1, 4, out=expected)
    aten.range.out_(1, 4, out=out)
    torch.testing.assert_close(out.cpu(), expected)


def test_gru_cell_backward_on_valid_shapes_matches_cpu():
    # The sweep's arguments crash this op on CPU too (its chunks are indexed unchecked); valid ones run.
    batch, hidden = 2, 3
    args = [torch.randn(batch, hidden), torch.randn(batch, 3 * hidden), torch.randn(batch, 3 * hidden),
            torch.randn(batch, hidden), torch.randn(3 * hidden), torch.randn(3 * hidden)]
    expected = aten._thnn_differentiable_gru_cell_backward(*args)
    got = aten._thnn_differentiable_gru_cell_backward(*[a.to("neuron") for a in args])
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e, atol=1e-5, rtol=1e-5)


QDTYPES = [torch.qint8, torch.quint8, torch.qint32]


def _quantized_cpu(scheme, dtype):
    x = torch.randn(3, 4)
    if scheme == "per_tensor":
        return torch.quantize_per_tensor(x, 0.05, 2, dtype)
    return torch.quantize_per_channel(x, torch.tensor([0.05, 0.1, 0.2]), torch.tensor([0, 1, 2]), 0, dtype)


@pytest.mark.parametrize("scheme", ["per_tensor", "per_channel"])
@pytest.mark.parametrize("dtype", QDTYPES)
def test_a_quantized_tensor_does_not_move_to_neuron(scheme, dtype, no_fallback):
    q = _quantized_cpu(scheme, dtype)
    for move in (lambda: q.to("neuron"), lambda: q.neuron(), lambda: q.clone().to("neuron").flatten(),
                 lambda: torch.empty(3, 4, device="neuron").copy_(q), lambda: q.copy_(torch.ones(3, 4, device="neuron"))):
        with pytest.raises(UnsupportedOpError, match=f"{QUANTIZED} .*{dtype}.*q.dequantize\\(\\).to\\('neuron'\\)"):
            move()
    # the advised path moves CPU's values exactly, and CPU's quantized tensor is untouched
    torch.testing.assert_close(q.dequantize().to("neuron").cpu(), q.dequantize())
    torch.testing.assert_close(q.flatten().int_repr(), q.int_repr().flatten())


@pytest.mark.parametrize("dtype", QDTYPES)
def test_quantizing_a_neuron_tensor_is_refused_by_name(dtype, no_fallback):
    x = torch.randn(3, 4)
    n = x.to("neuron")
    scales, zero_points = torch.tensor([0.05, 0.1, 0.2]), torch.tensor([0, 1, 2])
    calls = {
        "quantize_per_tensor": lambda: torch.quantize_per_tensor(n, 0.05, 2, dtype),
        "quantize_per_tensor.tensor_qparams": lambda: torch.quantize_per_tensor(
            n, torch.tensor(0.05, device="neuron"), torch.tensor(2, device="neuron"), dtype),
        "quantize_per_tensor.tensors": lambda: torch.quantize_per_tensor(
            [n], torch.tensor([0.05]), torch.tensor([2]), dtype),
        "quantize_per_channel": lambda: torch.quantize_per_channel(n, scales.to("neuron"), zero_points.to("neuron"),
                                                                   0, dtype),
        "quantize_per_tensor_dynamic": lambda: torch.quantize_per_tensor_dynamic(n, torch.quint8, False),
        "_make_per_tensor_quantized_tensor": lambda: torch._make_per_tensor_quantized_tensor(
            torch.zeros(3, 4, dtype=torch.int8, device="neuron"), 0.05, 2),
        "_make_per_channel_quantized_tensor": lambda: torch._make_per_channel_quantized_tensor(
            torch.zeros(3, 4, dtype=torch.int8, device="neuron"), scales.to("neuron"), zero_points.to("neuron"), 0),
        "empty": lambda: torch.empty(3, 4, dtype=dtype, device="neuron"),
        "_empty_affine_quantized": lambda: torch._empty_affine_quantized([3, 4], dtype=dtype, device="neuron"),
        "_empty_per_channel_affine_quantized": lambda: torch._empty_per_channel_affine_quantized(
            [3, 4], scales=scales.to("neuron"), zero_points=zero_points.to("neuron"), axis=0, dtype=dtype,
            device="neuron"),
    }
    for name, call in calls.items():
        op = name.partition(".")[0]
        with pytest.raises(UnsupportedOpError, match=f"aten::{op}.*{QUANTIZED}|{QUANTIZED} \\(aten::{op}"):
            call()
    # quantizing on CPU, as advised, is CPU's own result
    got = torch.quantize_per_tensor(n.cpu(), 0.05, 2, dtype)
    expected = torch.quantize_per_tensor(x, 0.05, 2, dtype)
    assert torch.equal(got.int_repr(), expected.int_repr())
