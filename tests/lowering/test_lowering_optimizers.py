"""Fused optimizer steps (torch.optim with fused=True) on neuron against the same steps on CPU."""
import pytest
import torch

import torchneuron

CONFIGS = [
    ("AdamW", {}),
    ("AdamW", {"weight_decay": 0.1, "maximize": True}),
    ("Adam", {"weight_decay": 0.1, "amsgrad": True}),
    ("Adam", {"betas": (0.8, 0.9), "eps": 1e-6}),
    ("SGD", {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("SGD", {"momentum": 0.9, "dampening": 0.1}),
    ("SGD", {}),
]


def _params(dtype):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(5, 3, generator=generator).to(dtype), torch.randn(7, generator=generator).to(dtype)]


def _steps(params, name, options, steps=4, tensor_lr=False):
    generator = torch.Generator().manual_seed(1)
    lr = torch.tensor(0.01) if tensor_lr else 0.01
    optimizer = getattr(torch.optim, name)(params, lr=lr, fused=True, **options)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)  # a new lr every step
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator).to(p.dtype).to(p.device)
        optimizer.step()
        schedule.step()
    return optimizer


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("name,options", CONFIGS)
def test_fused_step_matches_cpu(name, options, dtype, tol):
    cpu = [p.requires_grad_() for p in _params(dtype)]
    neuron = [p.detach().to("neuron").requires_grad_() for p in _params(dtype)]
    before = torchneuron.fallback_stats()
    cpu_optimizer = _steps(cpu, name, options)
    neuron_optimizer = _steps(neuron, name, options)
    assert torchneuron.fallback_stats() == before  # nothing ran on CPU
    for got, want in zip(neuron, cpu):
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=tol, atol=tol)
    for got, want in zip(neuron_optimizer.state.values(), cpu_optimizer.state.values()):
        for key in want:
            torch.testing.assert_close(got[key].cpu(), want[key], rtol=tol, atol=tol)


def test_tensor_lr_matches_cpu():
    cpu = [p.requires_grad_() for p in _params(torch.float32)]
    neuron = [p.detach().to("neuron").requires_grad_() for p in _params(torch.float32)]
    _steps(cpu, "AdamW", {"weight_decay": 0.1}, tensor_lr=True)
    _steps(neuron, "AdamW", {"weight_decay": 0.1}, tensor_lr=True)
    for got, want in zip(neuron, cpu):
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6)


def test_learning_rate_schedule_does_not_recompile():
    neuron = [p.to("neuron").requires_grad_() for p in _params(torch.float32)]
    _steps(neuron, "AdamW", {"weight_decay": 0.1}, steps=2)
    compiles = torchneuron.cache_stats()["compiles"]
    optimizer = _steps(neuron, "AdamW", {"weight_decay": 0.1}, steps=6)  # six more learning rates
    assert optimizer.param_groups[0]["lr"] != 0.01
    assert torchneuron.cache_stats()["compiles"] == compiles


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
@pytest.mark.parametrize("op", ["adam", "adamw", "sgd"])
def test_grad_scale_and_found_inf_match_cpu(op, found_inf):
    """What GradScaler passes: gradients are unscaled (and written back unscaled); a step with an inf
    changes nothing."""
    def run(device):
        generator = torch.Generator().manual_seed(2)
        lists = [[torch.randn(4, 3, generator=generator).to(device) for _ in range(2)] for _ in range(4)]
        scale = torch.tensor([64.0], device=device)
        inf = torch.tensor([found_inf], device=device)
        if op == "sgd":
            torch.ops.aten._fused_sgd_(lists[0], lists[1], lists[2], weight_decay=0.01, momentum=0.9, lr=0.1,
                                       dampening=0.0, nesterov=False, maximize=False, is_first_step=False,
                                       grad_scale=scale, found_inf=inf)
        else:
            steps = [torch.tensor(3.0, device=device) for _ in range(2)]
            fused = getattr(torch.ops.aten, f"_fused_{op}_")
            for exp_avg_sq in lists[3]:
                exp_avg_sq.abs_()
            fused(lists[0], lists[1], lists[2], lists[3], [], steps, lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=False,
                  maximize=False, grad_scale=scale, found_inf=inf)
        return lists

    for got_list, want_list in zip(run("neuron"), run("cpu")):
        for got, want in zip(got_list, want_list):
            torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
