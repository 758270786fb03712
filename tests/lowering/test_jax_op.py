"""torchneuron.jax_op: JAX and Pallas functions as PyTorch ops, checked against their CPU kernels."""
from __future__ import annotations

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import pytest
import torch
from torch.autograd import forward_ad

import torchneuron
from torchneuron.compile.backend import compile_stats
from torchneuron.eager import driver


@torchneuron.jax_op("test_jax_op::rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * weight


@torchneuron.jax_op("test_jax_op::sum_and_product")
def sum_and_product(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + y, x * y


def _load_example():
    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "pallas_rms_norm.py"
    spec = importlib.util.spec_from_file_location("pallas_rms_norm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pallas = _load_example()


def _grads_on(device, op, x, w):
    xd = x.detach().to(device).requires_grad_()
    wd = w.detach().to(device).requires_grad_()
    out = op(xd, wd, 1e-5)
    (out * out.detach().cos()).sum().backward()
    return out.cpu(), xd.grad.cpu(), wd.grad.cpu()


@pytest.mark.parametrize("op", [rms_norm, pallas.rms_norm], ids=["jax", "pallas"])
def test_forward_and_backward_on_neuron_match_cpu(op):
    x, w = torch.randn(6, 32), torch.randn(32)
    for neuron, cpu in zip(_grads_on("neuron", op, x, w), _grads_on("cpu", op, x, w)):
        torch.testing.assert_close(neuron, cpu)
    reference = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * w
    torch.testing.assert_close(op(x, w, 1e-5), reference)


@pytest.mark.parametrize("op", [rms_norm, pallas.rms_norm], ids=["jax", "pallas"])
def test_gradcheck_on_cpu_in_float64(op):
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: op(a, b, 1e-6), (x, w))


def _reference_rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("device", ["cpu", "neuron"])
@pytest.mark.parametrize("op", [rms_norm, pallas.rms_norm], ids=["jax", "pallas"])
def test_forward_mode_ad_matches_the_composed_ops(op, device):
    """Forward-mode AD through jax.jvp: dual tensors, torch.func.jvp, and a dual that also requires grad."""
    x, w = torch.randn(4, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    tx, tw = torch.randn_like(x), torch.randn_like(w)
    _, want = torch.func.jvp(_reference_rms_norm, (x, w), (tx, tw))
    _, want_x = torch.func.jvp(lambda a: _reference_rms_norm(a, w), (x,), (tx,))
    on = [t.to(device) for t in (x, w, tx, tw)]
    with forward_ad.dual_level():
        out = op(forward_ad.make_dual(on[0], on[2]), forward_ad.make_dual(on[1], on[3]), 1e-5)
        torch.testing.assert_close(forward_ad.unpack_dual(out).tangent.cpu(), want)
    _, got = torch.func.jvp(lambda a, b: op(a, b, 1e-5), (on[0], on[1]), (on[2], on[3]))
    torch.testing.assert_close(got.cpu(), want)
    leaf = on[0].detach().requires_grad_()
    with forward_ad.dual_level():
        out = op(forward_ad.make_dual(leaf, on[2]), on[1], 1e-5)
        torch.testing.assert_close(forward_ad.unpack_dual(out).tangent.cpu(), want_x)
        forward_ad.unpack_dual(out).primal.sum().backward()
    expected = torch.func.grad(lambda a: _reference_rms_norm(a, w).sum())(x)
    torch.testing.assert_close(leaf.grad.cpu(), expected)
    torch.testing.assert_close(torch.func.grad(lambda a: op(a, on[1], 1e-5).sum())(on[0]).cpu(), expected)


def test_forward_mode_ad_of_several_results():
    x, y, tx = torch.randn(5), torch.randn(5), torch.randn(5)
    with forward_ad.dual_level():
        total, product = sum_and_product(forward_ad.make_dual(x.to("neuron"), tx.to("neuron")), y.to("neuron"))
        torch.testing.assert_close(forward_ad.unpack_dual(total).tangent.cpu(), tx)
        torch.testing.assert_close(forward_ad.unpack_dual(product).tangent.cpu(), tx * y)


def test_defaults_keyword_arguments_and_bfloat16():
    @torchneuron.jax_op("test_jax_op::scaled_power")
    def scaled_power(x: torch.Tensor, y: torch.Tensor, power: int = 2, *, scale: float = 1.0) -> torch.Tensor:
        return scale * x**power * y

    x, y = torch.randn(5, dtype=torch.bfloat16), torch.randn(5, dtype=torch.bfloat16)
    results = []
    for device in ("cpu", "neuron"):
        xd = x.detach().to(device).requires_grad_()
        out = scaled_power(xd, y.to(device), scale=3.0)
        out.sum().backward()
        assert out.dtype == xd.grad.dtype == torch.bfloat16
        results.append((out.detach().cpu(), xd.grad.cpu()))
    torch.testing.assert_close(results[0], results[1])
    torch.testing.assert_close(results[0][0], 3.0 * x * x * y)


def test_the_default_backward_is_an_op_of_its_own():
    x, w = torch.randn(2, 8), torch.randn(8)
    g = torch.randn(2, 8)
    dx, dw = torch.ops.test_jax_op.rms_norm_vjp(g.to("neuron"), x.to("neuron"), w.to("neuron"), 1e-5)
    cx, cw = torch.ops.test_jax_op.rms_norm_vjp(g, x, w, 1e-5)
    torch.testing.assert_close(dx.cpu(), cx)
    torch.testing.assert_close(dw.cpu(), cw)


def test_several_results_and_their_gradients():
    x = torch.randn(4, requires_grad=True)
    y = torch.randn(4, requires_grad=True)
    s, p = sum_and_product(x.to("neuron"), y.to("neuron"))
    (s * 2 + p * 3).sum().backward()
    torch.testing.assert_close(s.cpu(), (x + y).detach())
    torch.testing.assert_close(p.cpu(), (x * y).detach())
    torch.testing.assert_close(x.grad, 2 + 3 * y.detach())
    torch.testing.assert_close(y.grad, 2 + 3 * x.detach())


def test_the_default_backward_holds_integers_constant_and_refuses_optional_tensors():
    @torchneuron.jax_op("test_jax_op::shifted")
    def shifted(x: torch.Tensor, shift: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return x * shift + (0 if bias is None else bias)

    x = torch.ones(3, device="neuron", requires_grad=True)
    shift = torch.tensor([1, 2, 3], device="neuron")
    shifted(x, shift, None).sum().backward()
    assert x.grad.cpu().tolist() == [1.0, 2.0, 3.0]
    bias = torch.zeros(3, device="neuron", requires_grad=True)
    with pytest.raises(NotImplementedError, match=r"plain Tensor arguments, not \['bias'\]"):
        shifted(x, shift, bias).sum().backward()


def test_register_autograd_replaces_the_default_backward():
    @torchneuron.jax_op("test_jax_op::double")
    def double(x: torch.Tensor) -> torch.Tensor:
        return 2 * x

    double.register_autograd(lambda ctx, grad: grad * 10)  # deliberately not 2: the override shows
    x = torch.ones(3, device="neuron", requires_grad=True)
    double(x).sum().backward()
    assert x.grad.cpu().tolist() == [10.0, 10.0, 10.0]


def test_each_call_signature_is_planned_once():
    x, w = torch.randn(5, 16).to("neuron"), torch.randn(16).to("neuron")
    plans = driver.plans_of(torch.ops.test_jax_op.rms_norm.default)
    rms_norm(x, w, 1e-5)
    before = len(plans)
    rms_norm(x * 2, w, 1e-5)
    assert len(plans) == before
    rms_norm(x, w, 1e-3)  # eps is static: another plan
    assert len(plans) == before + 1
    # a user's function is outside torchneuron's code hash: its programs are not stored on disk
    assert all(plan.function.identity is None for plan in plans.values())


@pytest.mark.parametrize("op", [rms_norm, pallas.rms_norm], ids=["jax", "pallas"])
def test_compiled_the_op_is_one_node_of_the_graph_executable(op):
    def loss(x, w):
        return op(x, w, 1e-5).relu().sum()

    x = torch.randn(4, 16).to("neuron").requires_grad_()
    w = torch.randn(16).to("neuron").requires_grad_()
    explained = torch._dynamo.explain(loss)(x, w)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    assert op._opoverload in [n.target for n in explained.graphs[0].graph.nodes]

    torch._dynamo.reset()
    before = compile_stats()
    out = torch.compile(loss, backend="neuron")(x, w)
    out.backward()
    after = compile_stats()
    assert after["graphs"] - before.get("graphs", 0) == 2  # forward and backward, each one executable
    assert after.get("eager_graphs", 0) == before.get("eager_graphs", 0)

    xc, wc = x.detach().cpu().requires_grad_(), w.detach().cpu().requires_grad_()
    expected = loss(xc, wc)
    expected.backward()
    torch.testing.assert_close(out.cpu(), expected.detach())
    torch.testing.assert_close(x.grad.cpu(), xc.grad)
    torch.testing.assert_close(w.grad.cpu(), wc.grad)


def test_a_result_other_than_declared_is_an_error():
    @torchneuron.jax_op("test_jax_op::two_for_one")
    def two_for_one(x: torch.Tensor) -> torch.Tensor:
        return x, x

    for device in ("cpu", "neuron"):
        with pytest.raises(RuntimeError, match="declares one Tensor, the JAX function returned a tuple of 2"):
            two_for_one(torch.ones(2, device=device))


def test_mutation_is_refused():
    with pytest.raises(ValueError, match="cannot mutate"):
        @torchneuron.jax_op("test_jax_op::add_in_place", mutates_args=("x",))
        def add_in_place(x: torch.Tensor, y: torch.Tensor) -> None:
            pass


def test_returns_must_be_tensors():
    with pytest.raises(ValueError, match="returns must be Tensors"):
        @torchneuron.jax_op("test_jax_op::count", schema="(Tensor x) -> int")
        def count(x):
            return x.size


def test_tensors_on_different_devices_are_an_error():
    x = torch.ones(3, device="neuron")
    with pytest.raises(RuntimeError, match="same device"):
        sum_and_product(x, torch.ones(3))
    with pytest.raises(RuntimeError, match="one device"):
        torch.compile(sum_and_product, backend="neuron")(x, torch.ones(3, device="neuron:1"))


def test_the_op_inside_a_fused_segment_and_a_captured_graph():
    x, w = torch.randn(6, 32), torch.randn(32)
    want = rms_norm(x, w, 1e-5) * 2
    xn, wn = x.to("neuron"), w.to("neuron")
    torch.neuron.synchronize()  # (nothing pending on another core, which would flush)
    with torchneuron.eager_mode("fused"):
        before = torchneuron.eager_stats()["pending_ops"]
        got = rms_norm(xn, wn, 1e-5) * 2
        assert torchneuron.eager_stats()["pending_ops"] == before + 2  # the op is one node of the segment
        torch.testing.assert_close(got.cpu(), want)
    step = torchneuron.capture(lambda a, b: rms_norm(a, b, 1e-5) * 2)
    for _ in range(3):
        x = torch.randn(6, 32)
        torch.testing.assert_close(step(x.to("neuron"), wn).cpu(), rms_norm(x, w, 1e-5) * 2)
    assert step.recordings == 1 and step.replays == 1
