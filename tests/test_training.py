"""Training real models on neuron gives the same losses as on CPU."""
import gc

import pytest
import torch

import torchneuron
from torchneuron.testing.models import train


@pytest.fixture
def no_fallback(monkeypatch):
    monkeypatch.setattr(torchneuron.config, "FALLBACK", "error")


@pytest.mark.parametrize("kind,optimizer", [("mlp", "sgd"), ("mlp", "adam"), ("cnn", "adamw"), ("gpt", "adamw")])
def test_losses_match_cpu_after_20_steps(kind, optimizer, no_fallback):
    cpu, cpu_model = train(kind, "cpu", 20, optimizer)
    neuron, neuron_model = train(kind, "neuron", 20, optimizer)
    torch.testing.assert_close(neuron, cpu, rtol=1e-4, atol=1e-6)
    if optimizer != "sgd":
        return  # Adam's normalisation turns rounding noise in zero gradients (attention's key bias) into steps
    for (name, p_cpu), p_neuron in zip(cpu_model.state_dict().items(), neuron_model.state_dict().values()):
        torch.testing.assert_close(p_neuron.cpu(), p_cpu, rtol=1e-3, atol=1e-4, msg=name)


def losses_decrease(losses):
    return sum(losses[-5:]) < sum(losses[:5])


def test_memory_returns_to_baseline_after_200_steps(no_fallback):
    gc.collect()
    base = torch.neuron.memory_allocated()
    losses, model = train("mlp", "neuron", 200, "adamw")
    assert losses_decrease(losses)
    del model
    gc.collect()
    assert torch.neuron.memory_allocated() == base
