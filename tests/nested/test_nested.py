"""NestedTensor on neuron against CPU: the jagged layout (padded conversions, SDPA from transposed
(B, j, H, D) inputs, backward, a transformer layer training, torch.compile) and the strided layout's
kernels (construction, moves, to_padded_tensor, elementwise, bmm, matmul, linear, softmax, transpose,
unbind, backward). Every comparison checks `.is_nested`, the layout, the sizes and the values."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchneuron  # noqa: F401  (registers the device)

pytestmark = pytest.mark.usefixtures("no_fallback")
LENGTHS = (3, 5, 7)


def components(lengths=LENGTHS, inner=(4,), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, *inner, generator=g) for n in lengths]


def to_neuron(t):
    return t.to("neuron") if isinstance(t, torch.Tensor) else t


def assert_same(cpu, dev, rtol=1e-5, atol=1e-5):
    assert isinstance(dev, torch.Tensor) and dev.device.type == "neuron", dev
    assert dev.is_nested == cpu.is_nested and dev.layout == cpu.layout and dev.dtype == cpu.dtype
    if cpu.is_nested:
        assert len(dev.unbind()) == len(cpu.unbind())
        for d, c in zip(dev.unbind(), cpu.unbind()):
            assert d.shape == c.shape
            torch.testing.assert_close(d.cpu(), c, rtol=rtol, atol=atol)
    else:
        assert dev.shape == cpu.shape
        torch.testing.assert_close(dev.cpu(), cpu, rtol=rtol, atol=atol)


def jagged(parts, device, requires_grad=False):
    return torch.nested.nested_tensor([p.to(device) for p in parts], layout=torch.jagged,
                                      requires_grad=requires_grad)


# ------------------------------------------------------------------------------------------ jagged


def test_jagged_padded_conversions():
    parts = components()
    cpu, dev = jagged(parts, "cpu"), jagged(parts, "neuron")
    assert dev.is_nested and dev.layout == torch.jagged
    for padding in (0.0, -1.5):
        assert_same(torch.nested.to_padded_tensor(cpu, padding), torch.nested.to_padded_tensor(dev, padding))
    values, offsets = torch.cat(parts), torch.tensor([0, 3, 8, 15])
    c = torch.nested.nested_tensor_from_jagged(values, offsets)
    d = torch.nested.nested_tensor_from_jagged(values.to("neuron"), offsets.to("neuron"))
    assert_same(c, d)
    assert_same(torch.nested.to_padded_tensor(c, 0.0), torch.nested.to_padded_tensor(d, 0.0))
    dense, starts, lengths = torch.randn(3, 10, 4), torch.tensor([0, 2, 4]), torch.tensor([3, 5, 6])
    c = torch.nested.narrow(dense, 1, starts, lengths, layout=torch.jagged)
    d = torch.nested.narrow(dense.to("neuron"), 1, starts.to("neuron"), lengths.to("neuron"), layout=torch.jagged)
    assert_same(c, d)
    assert_same(torch.nested.to_padded_tensor(c.contiguous(), 0.0), torch.nested.to_padded_tensor(d.contiguous(), 0.0))


def test_jagged_to_padded_backward():
    parts = components()
    cpu, dev = jagged(parts, "cpu", True), jagged(parts, "neuron", True)
    weight = torch.randn(3, 7, 4)
    for t, w in ((cpu, weight), (dev, weight.to("neuron"))):
        (torch.nested.to_padded_tensor(t, 0.0) * w).sum().backward()
    assert_same(cpu.grad, dev.grad)


def sdpa_inputs(device, requires_grad=False, heads=2, head_dim=8):
    # PyTorch's NJT SDPA tutorial: (B, j, H, D) jagged tensors, transposed to (B, H, j, D)
    return [jagged(components(LENGTHS, (heads, head_dim), seed), device, requires_grad) for seed in (1, 2, 3)]


def test_jagged_sdpa_forward_and_backward():
    outs, leaves = [], []
    for device in ("cpu", "neuron"):
        q, k, v = sdpa_inputs(device, requires_grad=True)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        out = out.transpose(1, 2)
        (out.values() * torch.arange(out.values().numel(), device=device).reshape(out.values().shape)).sum().backward()
        outs.append(out)
        leaves.append((q, k, v))
    assert_same(outs[0], outs[1])
    for c, d in zip(*leaves):
        assert_same(c.grad, d.grad, rtol=1e-4, atol=1e-4)


def test_jagged_sdpa_keys_of_other_lengths():
    # cross attention: keys and values of their own lengths, the values built from packed values and
    # the keys' offsets (no maximum length known: padding goes to the total length)
    outs = []
    for device in ("cpu", "neuron"):
        q = jagged(components((3, 5, 7), (2, 8), seed=7), device).transpose(1, 2)
        k = jagged(components((4, 2, 9), (2, 8), seed=8), device)
        v = torch.nested.nested_tensor_from_jagged(torch.randn(15, 2, 8, generator=torch.Generator().manual_seed(9))
                                                   .to(device), k.offsets())
        outs.append(F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), scale=0.3))
    assert_same(outs[0], outs[1])


class Block(torch.nn.Module):
    """A transformer layer on jagged (B, j, E) sequences: q/k/v projections, SDPA, MLP, layer norms."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(dim, dim) for _ in range(4))
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        q, k, v = (p(h).unflatten(-1, (self.heads, -1)).transpose(1, 2) for p in (self.q, self.k, self.v))
        x = x + self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2))
        return x + self.mlp(self.norm2(x))


def test_jagged_transformer_layer_trains_as_on_cpu():
    torch.manual_seed(0)
    lengths = (3, 40, 17, 9)
    parts, targets = components(lengths, (16,), seed=4), components(lengths, (16,), seed=5)
    model = Block()
    losses = {}
    for device in ("cpu", "neuron"):
        m = Block().to(device)
        m.load_state_dict(model.state_dict())
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        x = jagged(parts, device)
        y = torch.nested.nested_tensor_from_jagged(torch.cat(targets).to(device), x.offsets())
        losses[device] = []
        for _ in range(5):
            loss = ((m(x) - y).values() ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[device].append(loss.item())
        losses[device + "_params"] = [p.detach().cpu() for p in m.parameters()]
    torch.testing.assert_close(losses["neuron"], losses["cpu"], rtol=1e-4, atol=1e-5)
    for c, d in zip(losses["cpu_params"], losses["neuron_params"]):
        torch.testing.assert_close(d, c, rtol=1e-4, atol=1e-5)


def test_jagged_compiled_linear_and_sdpa(fresh_dynamo):
    torch.manual_seed(0)
    model = Block()
    parts = components((3, 11, 6), (16,), seed=6)
    expected = model(jagged(parts, "cpu"))
    (expected.values() ** 2).sum().backward()
    on_neuron = Block().to("neuron")
    on_neuron.load_state_dict(model.state_dict())
    out = torch.compile(on_neuron, backend="neuron", fullgraph=True)(jagged(parts, "neuron"))
    assert_same(expected, out, rtol=1e-4, atol=1e-5)
    (out.values() ** 2).sum().backward()
    for c, d in zip(model.parameters(), on_neuron.parameters()):
        assert_same(c.grad, d.grad, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------------- strided


def strided(parts, device, requires_grad=False):
    return torch.nested.nested_tensor([p.to(device) for p in parts], requires_grad=requires_grad)


def test_strided_construction_and_moves():
    parts = components()
    cpu = strided(parts, "cpu")
    built = strided(parts, "neuron")
    moved = cpu.to("neuron")
    assert built.layout == torch.strided and built.is_nested
    assert_same(cpu, built)
    assert_same(cpu, moved)
    back = moved.cpu()
    assert back.is_nested and back.device.type == "cpu"
    for b, c in zip(back.unbind(), cpu.unbind()):
        torch.testing.assert_close(b, c)
    assert_same(torch.nested.to_padded_tensor(cpu, 0.5), torch.nested.to_padded_tensor(moved, 0.5))
    assert_same(torch.nested.to_padded_tensor(cpu, 0.0, (3, 8, 6)),
                torch.nested.to_padded_tensor(moved, 0.0, (3, 8, 6)))


W, B = torch.randn(6, 4), torch.randn(6)

STRIDED_OPS = {
    "add": lambda t: t + t,
    "add_scalar": lambda t: t + 1.5,
    "sub": lambda t: t - 2 * t,
    "mul": lambda t: t * t,
    "mul_scalar": lambda t: t * 3,
    "div_scalar": lambda t: t / 4,
    "neg": lambda t: -t,
    "relu": lambda t: t.relu(),
    "gelu": F.gelu,
    "silu": F.silu,
    "tanh": torch.tanh,
    "bmm": lambda t: torch.bmm(t, t.transpose(1, 2)),
    "matmul": lambda t: torch.matmul(t, t.transpose(1, 2).contiguous()),
    "linear": lambda t: F.linear(t, W.to(t.device), B.to(t.device)),
    "softmax": lambda t: t.softmax(-1),
    "transpose": lambda t: t.transpose(1, 2).contiguous(),
}


@pytest.mark.parametrize("name", sorted(STRIDED_OPS))
def test_strided_op(name):
    parts = components()
    fn = STRIDED_OPS[name]
    assert_same(fn(strided(parts, "cpu")), fn(strided(parts, "neuron")))


def test_strided_unbind_and_inplace():
    parts = components()
    cpu, dev = strided(parts, "cpu"), strided(parts, "neuron")
    for c, d in zip(cpu.unbind(), dev.unbind()):
        assert_same(c, d)
    cpu.mul_(2).add_(cpu)
    dev.mul_(2).add_(dev)
    assert_same(cpu, dev)


def test_strided_backward():
    parts = components()
    grads = []
    for device in ("cpu", "neuron"):
        t = strided(parts, device, requires_grad=True)
        w, b = (p.detach().to(device).clone().requires_grad_() for p in (W, B))
        out = torch.matmul(F.linear(t, w, b).relu().softmax(-1), torch.nested.nested_tensor(
            [torch.ones(6, 2, device=device)] * len(parts)))
        torch.nested.to_padded_tensor(out, 0.0).sum().backward()
        grads.append((t.grad, w.grad, b.grad))
    for c, d in zip(*grads):
        assert_same(c, d, rtol=1e-4, atol=1e-5)


def test_strided_layer_norm_forward_and_backward():
    parts = components(inner=(2, 4))
    results = []
    for device in ("cpu", "neuron"):
        t = strided(parts, device, requires_grad=True)
        w, b = (torch.randn(2, 4, generator=torch.Generator().manual_seed(s)).to(device).requires_grad_() for s in (0, 1))
        out = F.layer_norm(t, (2, 4), w, b)
        torch.nested.to_padded_tensor(out * out, 0.0).sum().backward()
        results.append((out, t.grad, w.grad, b.grad))
    for c, d in zip(*results):
        assert_same(c.detach(), d.detach(), rtol=1e-4, atol=1e-5)


def test_strided_unsupported_op_names_op_and_layout():
    dev = strided(components(), "neuron")
    with pytest.raises(NotImplementedError, match=r"aten::sum\.dim_IntList.*torch\.strided"):
        dev.sum(-1, keepdim=True)
