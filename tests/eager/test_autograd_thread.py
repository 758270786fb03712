"""Which thread runs backward: the calling one by default (TORCHNEURON_AUTOGRAD_THREADS=0), PyTorch's
per-device worker where asked; gradients match CPU either way."""
import threading

import pytest
import torch
import torch.utils.checkpoint

import torchneuron  # noqa: F401
from torchneuron.testing.processes import run_code


def backward_thread_and_grad(device):
    """The thread a backward hook ran on, and the gradient, of a small graph on `device`."""
    torch.manual_seed(0)
    w = torch.randn(5, 3).to(device).requires_grad_()
    seen = []
    w.register_hook(lambda g: seen.append(threading.get_ident()))
    (torch.tanh(torch.randn(4, 5).to(device) @ w) ** 2).sum().backward()
    return seen[0], w.grad.cpu()


def test_backward_runs_on_the_calling_thread():
    ident, grad = backward_thread_and_grad("neuron")
    assert ident == threading.get_ident()
    torch.testing.assert_close(grad, backward_thread_and_grad("cpu")[1])


def test_device_threads_on_request_give_the_same_gradients():
    with torch.autograd.set_multithreading_enabled(True):
        ident, grad = backward_thread_and_grad("neuron")
    assert ident != threading.get_ident()
    torch.testing.assert_close(grad, backward_thread_and_grad("cpu")[1])


def test_backward_from_a_user_thread():
    # The setting is per thread: a thread the user starts keeps PyTorch's default.
    result = {}
    worker = threading.Thread(target=lambda: result.update(zip(("ident", "grad"), backward_thread_and_grad("neuron"))))
    worker.start()
    worker.join()
    assert result["ident"] not in (threading.get_ident(), worker.ident)
    torch.testing.assert_close(result["grad"], backward_thread_and_grad("cpu")[1])


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpointed_backward_matches_cpu(use_reentrant):
    # Reentrant checkpointing runs a nested backward from inside backward: on the same thread here.
    def grads(device):
        torch.manual_seed(0)
        layer = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.GELU(), torch.nn.Linear(6, 2)).to(device)
        x = torch.randn(3, 6).to(device).requires_grad_()
        torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=use_reentrant).square().sum().backward()
        return [x.grad.cpu()] + [p.grad.cpu() for p in layer.parameters()]

    for got, want in zip(grads("neuron"), grads("cpu")):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_environment_variable_keeps_device_threads():
    code = ("import threading, torch, torchneuron\n"
            "w = torch.ones(3, device='neuron', requires_grad=True)\n"
            "seen = []\n"
            "w.register_hook(lambda g: seen.append(threading.get_ident()))\n"
            "(w * 2).sum().backward()\n"
            "print(seen[0] != threading.get_ident())\n")
    out = run_code(code, env={"TORCHNEURON_AUTOGRAD_THREADS": "1"})
    assert out.stdout.strip().splitlines()[-1] == "True"
