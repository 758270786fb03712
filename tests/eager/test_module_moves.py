"""Module moves onto and off neuron keep their Parameter objects, as moves to CUDA do
(torchneuron/module_moves.py): an optimizer built before the move trains, ties stay tied."""
import copy
import pathlib

import pytest
import torch

from torchneuron.testing.models import MLP
from torchneuron.testing.processes import last_json, run_python, run_torchrun

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "accelerate_train.py"

OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2),
    "adam_foreach_off": lambda params: torch.optim.Adam(params, lr=1e-2, foreach=False),
}


def _steps(model, opt, device, steps=4):
    generator = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 16, generator=generator).to(device)
        y = torch.randint(0, 4, (8,), generator=generator).to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_optimizer_built_before_the_move_trains_as_on_cpu(optimizer):
    torch.manual_seed(0)
    reference = MLP()
    model = copy.deepcopy(reference)
    expected = _steps(reference, OPTIMIZERS[optimizer](reference.parameters()), "cpu")

    opt = OPTIMIZERS[optimizer](model.parameters())  # built on the CPU model
    before = list(model.parameters())
    model.to("neuron")
    assert all(a is b for a, b in zip(before, model.parameters()))
    assert all(p.device.type == "neuron" for group in opt.param_groups for p in group["params"])
    losses = _steps(model, opt, "neuron")
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-5)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-5)


def test_tied_weights_stay_one_parameter_through_moves_and_casts():
    embedding = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = embedding.weight
    model = torch.nn.Sequential(embedding, head)
    weight = embedding.weight
    for move in (lambda m: m.to("neuron"), lambda m: m.half(), lambda m: m.float(), lambda m: m.cpu(),
                 lambda m: m.to("neuron", torch.float64)):
        move(model)
        assert model[0].weight is weight and model[1].weight is weight
        assert len(list(model.parameters())) == 1
    assert weight.device.type == "neuron" and weight.dtype == torch.float64


def test_gradients_move_with_their_parameters():
    model = torch.nn.Linear(3, 2).to("neuron")
    weight = model.weight
    model(torch.randn(4, 3, device="neuron")).sum().backward()
    grad = weight.grad.cpu()
    model.cpu()
    assert model.weight is weight and weight.grad.device.type == "cpu"
    torch.testing.assert_close(weight.grad, grad)
    model.to("neuron")  # and back: backward accumulates into the moved gradient
    model(torch.randn(4, 3, device="neuron")).sum().backward()
    assert weight.grad.device.type == "neuron"


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_the_rule_answers_as_for_cuda(device):
    """Dense tensors of any of the dense backends are compatible; meta and sparse ones are not."""
    dense = torch.ones(2, device=device)
    assert torch._has_compatible_shallow_copy_type(dense, torch.ones(2, device="neuron"))
    assert torch._has_compatible_shallow_copy_type(torch.ones(2, device="neuron"), dense)
    assert not torch._has_compatible_shallow_copy_type(torch.ones(2, device="meta"),
                                                       torch.ones(2, device="neuron"))
    assert not torch._has_compatible_shallow_copy_type(torch.ones(2, device="neuron"),
                                                       torch.eye(2).to_sparse())


def test_moves_from_meta_replace_parameters_as_on_cpu():
    with torch.device("meta"):
        on_meta = [torch.nn.Linear(2, 2) for _ in range(2)]
    kept = {}
    for module, device in zip(on_meta, ("cpu", "neuron")):
        weight = module.weight
        module.to_empty(device=device)
        kept[device] = module.weight is weight
    assert kept["neuron"] == kept["cpu"]


def test_swapping_on_conversion_still_works():
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model = torch.nn.Linear(2, 2)
        weight = model.weight
        model.to("neuron")
        assert model.weight is weight and weight.device.type == "neuron"
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_accelerate_prepare_with_the_optimizer_built_first_trains_as_on_cpu():
    accelerate = pytest.importorskip("accelerate")
    results = {}
    for device in ("cpu", "neuron"):
        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
        torch.manual_seed(0)
        model = MLP()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        accelerator = accelerate.Accelerator(cpu=device == "cpu")
        model, opt = accelerator.prepare(model, opt)
        assert next(model.parameters()).device.type == device
        results[device] = (_steps(model, opt, accelerator.device), [p.detach().cpu() for p in model.parameters()])
    torch.testing.assert_close(results["neuron"], results["cpu"], rtol=1e-5, atol=1e-5)


def _example(*argv, processes=1):
    env = {"OMP_NUM_THREADS": "1", "TORCHNEURON_CORES": "2"}
    if processes == 1:
        return last_json(run_python(EXAMPLE, "--steps", "6", *argv, env=env))
    return last_json(run_torchrun(EXAMPLE, "--steps", "6", *argv, processes=processes, env=env))


@pytest.mark.slow  # a subprocess (71 s here); the in-process accelerate test above covers prepare() in the default tier
@pytest.mark.parametrize("processes", [1, 2])
def test_accelerate_example_trains_as_on_cpu(processes):
    neuron, cpu = _example(processes=processes), _example("--cpu", processes=processes)
    assert neuron["device"].startswith("neuron") and neuron["processes"] == processes
    assert neuron["weights_moved"] > 1.0
    torch.testing.assert_close(neuron["losses"], cpu["losses"], rtol=1e-5, atol=1e-5)
    assert neuron["weights_moved"] == pytest.approx(cpu["weights_moved"], rel=1e-5)

