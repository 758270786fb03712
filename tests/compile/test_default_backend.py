"""torch.compile(model) with the default backend: graphs of neuron tensors compile through the
"neuron" backend (torchneuron/default_backend.py), other graphs through inductor."""
import pytest
import torch
import torch._dynamo

from torchneuron.compile import compile_stats
from torchneuron.testing.float64 import shadowed_training
from torchneuron.testing.models import GPT, MLP, batches, loss_of, train_step

pytestmark = pytest.mark.usefixtures("fresh_dynamo", "no_fallback")


@pytest.fixture
def inductor_calls(monkeypatch):
    """How many graphs reached inductor (torch.compile's wrapper imports compile_fx at each call)."""
    import torch._inductor.compile_fx as compile_fx_module

    calls = []
    original = compile_fx_module.compile_fx

    def compile_fx(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(compile_fx_module, "compile_fx", compile_fx)
    return calls


def _graphs():
    return compile_stats().get("graphs", 0)


def _twin(model_cls):
    torch.manual_seed(0)
    cpu_model = model_cls()
    model = model_cls().to("neuron")
    model.load_state_dict(cpu_model.state_dict())
    return cpu_model, model


@pytest.mark.parametrize("kwargs", [{}, {"mode": "reduce-overhead"}, {"mode": "max-autotune"}, {"fullgraph": True}],
                         ids=["default", "reduce-overhead", "max-autotune", "fullgraph"])
def test_mlp_forward_and_backward(kwargs, inductor_calls):
    cpu_model, model = _twin(MLP)
    compiled = torch.compile(model, **kwargs)
    x, y = next(iter(batches("mlp", 1, batch=8)))
    graphs = _graphs()
    expected = loss_of("mlp", cpu_model, x, y)
    actual = loss_of("mlp", compiled, x.to("neuron"), y.to("neuron"))
    expected.backward()
    actual.backward()
    assert _graphs() - graphs == 2  # forward and backward, both ours
    assert inductor_calls == []
    assert compile_stats().get("eager_graphs", 0) == 0
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-5, atol=1e-6)
    for (name, p_cpu), p in zip(cpu_model.named_parameters(), model.parameters()):
        torch.testing.assert_close(p.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow  # 31 s here; test_mlp_forward_and_backward covers the routing, test_compile.py GPT through "neuron"
def test_gpt_training_step(inductor_calls):
    # each compiled step as close to a float64 CPU step from the same state as CPU's float32 step
    # (testing/float64.py); AdamW: Dynamo makes it capturable, compiled as forward, backward, update
    graphs = _graphs()
    errors = shadowed_training("gpt", 3, "adamw", step=torch.compile(train_step))
    assert errors.failures(ulps=10) == []  # capturable AdamW: see test_compile.py
    assert _graphs() - graphs >= 3
    assert inductor_calls == []
    assert compile_stats().get("eager_graphs", 0) == 0


def test_dynamic_lengths():
    torch.manual_seed(0)
    model = GPT().to("neuron").eval()
    compiled = torch.compile(model, dynamic=True)
    compiles = compile_stats().get("compiles", 0)
    for t in (3, 5, 9, 16):
        idx = torch.randint(0, 64, (2, t)).to("neuron")
        with torch.no_grad():
            torch.testing.assert_close(compiled(idx).cpu(), model(idx).cpu(), rtol=1e-4, atol=1e-5)
    assert compile_stats()["compiles"] - compiles <= 2  # one graph, buckets 8 and 16


def test_cpu_models_still_compile_with_inductor(inductor_calls):
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(4, 16)
    before = compile_stats()
    out = torch.compile(model)(x)
    torch.testing.assert_close(out, model(x))
    assert len(inductor_calls) == 1
    assert compile_stats() == before


def test_backends_listed():
    assert {"inductor", "neuron"} <= set(torch._dynamo.list_backends())
    assert torch._TorchCompileInductorWrapper.routes_neuron
