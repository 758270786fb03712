"""Fake quantization on neuron gives CPU's values and masks exactly, its gradients too, and
torch.ao.quantization's FakeQuantize module runs without a CPU fallback."""
import pytest
import torch

aten = torch.ops.aten


def _neuron(v):
    return v.to("neuron") if isinstance(v, torch.Tensor) else v


def _same_as_cpu(op, x, *args):
    expected = op(x, *args)
    got = op(x.to("neuron"), *map(_neuron, args))
    for g, e in zip(got, expected):
        assert torch.equal(g.cpu(), e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("scale", "zero_point", "quant_min", "quant_max"),
                         [(0.1, 3, -128, 127), (0.037, 0, 0, 255), (1e-3, -5, -2**31, 2**31 - 1)])
def test_per_tensor(dtype, scale, zero_point, quant_min, quant_max, lowered_only):
    x = torch.randn(3, 4, 50, dtype=dtype) * 8
    _same_as_cpu(aten.fake_quantize_per_tensor_affine_cachemask.default, x, scale, zero_point, quant_min, quant_max)


@pytest.mark.parametrize("enabled", [1, 0])
def test_per_tensor_tensor_qparams(enabled, lowered_only):
    x = torch.randn(3, 4, 50) * 8
    _same_as_cpu(aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default, x,
                 torch.tensor([0.07]), torch.tensor([-4], dtype=torch.int32), torch.tensor([enabled]), -128, 127)


@pytest.mark.parametrize("zero_point_dtype", [torch.int32, torch.float32])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_per_channel(zero_point_dtype, axis, lowered_only):
    x = torch.randn(3, 4, 5) * 8
    channels = x.shape[axis]
    scale = torch.rand(channels) * 0.2 + 0.01
    zero_point = (torch.randn(channels) * 3).to(zero_point_dtype)
    _same_as_cpu(aten.fake_quantize_per_channel_affine_cachemask.default, x, scale, zero_point, axis, -128, 127)


def test_gradients_pass_inside_the_range_only(no_fallback):
    x = torch.randn(4, 30) * 10
    grads = []
    for device in ("cpu", "neuron"):
        leaf = x.to(device, copy=True).requires_grad_()
        y = torch.fake_quantize_per_tensor_affine(leaf, 0.05, 0, -128, 127)
        z = torch.fake_quantize_per_channel_affine(leaf, torch.full((30,), 0.05, device=device),
                                                   torch.zeros(30, dtype=torch.int32, device=device), 1, -100, 100)
        (y * 2 + z).sum().backward()
        grads.append(leaf.grad.cpu())
    assert torch.equal(grads[0], grads[1])


def test_fake_quantize_module_as_cpu(no_fallback):
    x = torch.randn(8, 16) * 3
    cpu, neuron = torch.ao.quantization.FakeQuantize(), torch.ao.quantization.FakeQuantize().to("neuron")
    for step in range(3):
        torch.testing.assert_close(neuron(_neuron(x + step)).cpu(), cpu(x + step))
    torch.testing.assert_close(neuron.scale.cpu(), cpu.scale)
    assert torch.equal(neuron.zero_point.cpu(), cpu.zero_point)
