"""Forward-mode AD on neuron: dual tensors (torch.autograd.forward_ad) and torch.func's jvp,
jacfwd and hessian give CPU's tangents, for whole models and through views and in-place ops."""
import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import functional_call, hessian, jacfwd, jacrev, jvp
from torch.nn.attention import SDPBackend, sdpa_kernel

from torchneuron.testing.models import CNN, GPT, MLP, batches, loss_of


def _loss_jvp(kind, model_cls, device):
    torch.manual_seed(0)
    model = model_cls().eval().to(device)
    x, y = (t.to(device) for t in next(iter(batches(kind, 1, batch=4))))
    params = dict(model.named_parameters())
    torch.manual_seed(1)
    tangents = {k: torch.randn(v.shape).to(device) for k, v in params.items()}

    def loss(p):
        return loss_of(kind, lambda *inputs: functional_call(model, p, inputs), x, y)

    value, tangent = jvp(loss, (params,), (tangents,))
    return value.item(), tangent.item()


@pytest.mark.parametrize("kind,model_cls", [("mlp", MLP), ("cnn", CNN), ("gpt", GPT)])
def test_model_loss_jvp_matches_cpu(kind, model_cls):
    # CPU's fused attention kernel has no forward derivative: the reference uses the math one
    with sdpa_kernel(SDPBackend.MATH):
        cpu = _loss_jvp(kind, model_cls, "cpu")
    dev = _loss_jvp(kind, model_cls, "neuron")
    torch.testing.assert_close(dev, cpu, rtol=1e-4, atol=1e-5)


def test_dual_tensors_through_views_and_inplace_ops():
    def run(device):
        x, t = torch.arange(12.0).to(device), torch.linspace(-1, 1, 12).to(device)
        with fwAD.dual_level():
            d = fwAD.make_dual(x.clone(), t)
            view = d.view(3, 4).t()[1:]            # a strided view of the dual
            view.mul_(view.sin())                  # in place through it: tangents of base and view change
            d[::3].add_(d[1::3].exp())             # overlapping reads, strided writes
            out = (d.view(3, 4) @ d.view(4, 3)).tanh()
            primal, tangent = fwAD.unpack_dual(out)
            base_tangent = fwAD.unpack_dual(d).tangent
            return primal.cpu(), tangent.cpu(), base_tangent.cpu()

    for a, b in zip(run("cpu"), run("neuron")):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_jacfwd_jacrev_and_hessian_match_cpu():
    def f(x):
        return torch.stack([x.pow(3).sum(), (x[:-1] * x[1:]).sin().sum(), torch.logsumexp(x, 0)])

    x = torch.randn(5, dtype=torch.float64)
    xn = x.to("neuron")
    torch.testing.assert_close(jacfwd(f)(xn).cpu(), jacrev(f)(x))
    torch.testing.assert_close(jacrev(f)(xn).cpu(), jacrev(f)(x))
    g = lambda x: f(x).sum()
    torch.testing.assert_close(hessian(g)(xn).cpu(), hessian(g)(x))


@pytest.mark.usefixtures("lowered_only")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # (CPU has no half glu_jvp)
def test_glu_forward_derivative_is_lowered(dtype):
    x, t = torch.randn(4, 6, dtype=dtype), torch.randn(4, 6, dtype=dtype)
    expected = jvp(lambda x: torch.nn.functional.glu(x, 1), (x,), (t,))
    got = jvp(lambda x: torch.nn.functional.glu(x, 1), (x.to("neuron"),), (t.to("neuron"),))
    for a, b in zip(expected, got):
        torch.testing.assert_close(b.cpu(), a)
