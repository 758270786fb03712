"""Compare an op on neuron against the same op on CPU."""
from __future__ import annotations

import math

import torch
from torch.utils._pytree import tree_flatten, tree_map

import torchneuron


def to_neuron(x):
    return tree_map(lambda t: t.to("neuron") if isinstance(t, torch.Tensor) else t, x)


def to_cpu(x):
    return tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, x)


def assert_same(cpu_value, neuron_value, rtol=None, atol=None):
    cpu_flat, _ = tree_flatten(cpu_value)
    neuron_flat, _ = tree_flatten(neuron_value)
    assert len(cpu_flat) == len(neuron_flat)
    for c, n in zip(cpu_flat, neuron_flat):
        if isinstance(c, torch.Tensor):
            assert isinstance(n, torch.Tensor) and n.device.type == "neuron", n
            assert n.shape == c.shape and n.dtype == c.dtype, (n.shape, c.shape, n.dtype, c.dtype)
            torch.testing.assert_close(n.cpu(), c, rtol=rtol, atol=atol, equal_nan=True)
        else:
            assert n == c or (math.isnan(c) and math.isnan(n)), (n, c)


def check(fn, *args, rtol=None, atol=None, grad=False, **kwargs):
    """Run fn on CPU and on neuron copies of the inputs; assert equal outputs (and, with grad=True,
    equal gradients of every floating input)."""
    cpu_args = tree_map(lambda t: t.detach().clone().requires_grad_(grad and t.is_floating_point())
                        if isinstance(t, torch.Tensor) else t, args)
    dev_args = tree_map(lambda t: t.detach().to("neuron").requires_grad_(grad and t.is_floating_point())
                        if isinstance(t, torch.Tensor) else t, args)
    expected = fn(*cpu_args, **kwargs)
    actual = fn(*dev_args, **kwargs)
    assert_same(expected, actual, rtol, atol)
    if grad:
        outs_c = [o for o in tree_flatten(expected)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
        outs_n = [o for o in tree_flatten(actual)[0] if isinstance(o, torch.Tensor) and o.requires_grad]
        seeds = [torch.randn_like(o) for o in outs_c]
        torch.autograd.backward(outs_c, seeds)
        torch.autograd.backward(outs_n, [s.to("neuron") for s in seeds])
        for c, n in zip(tree_flatten(cpu_args)[0], tree_flatten(dev_args)[0]):
            if isinstance(c, torch.Tensor) and c.requires_grad and c.grad is not None:
                torch.testing.assert_close(n.grad.cpu(), c.grad, rtol=rtol, atol=atol)
    return actual


def check_grad(fn, *args, **kwargs):
    """check(fn, *args, grad=True), and neither the forward nor the backward ran an op on CPU (backward
    formulas call ops of other families: those must be lowered too)."""
    before = torchneuron.fallback_stats()
    check(fn, *args, grad=True, **kwargs)
    fell = {op: n - before.get(op, 0) for op, n in torchneuron.fallback_stats().items() if n != before.get(op, 0)}
    assert not fell, f"ran on CPU: {fell}"
