"""Whole-step graphs on neuron: torch.neuron.NeuronGraph / graph / make_graphed_callables (CUDA's API)
and torchneuron.capture, each against strict eager."""
import pytest
import torch
import torch.nn.functional as F

import torchneuron
from torchneuron.runtime.capture import STATS, CaptureError
from torchneuron.testing.models import GPT, batches, train_step
from torchneuron.testing.processes import runs_sharing_a_cache


def _gpt_step(seed=0):
    torch.manual_seed(seed)
    model = GPT().to("neuron")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)  # as CUDA graphs require

    def step(x, y):
        loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach()

    step.optimizer = optimizer
    return model, step


DATA = [(x.to("neuron"), y.to("neuron")) for x, y in batches("gpt", 20, batch=4)]


def _strict_losses():
    _, step = _gpt_step()
    return torch.stack([step(x, y) for x, y in DATA]).cpu()


def test_capture_replays_the_gpt_training_step_as_strict_eager():
    want = _strict_losses()
    _model, step = _gpt_step()
    step = torchneuron.capture(step)
    replays = STATS["replays"]
    got = torch.stack([step(x, y) for x, y in DATA]).cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert step.recordings == 1 and step.replays == 18  # call 1 eager, call 2 recorded, 18 replays
    assert STATS["replays"] - replays == 18
    assert len({id(loss) for loss in got}) == 20  # each replay returns its own loss tensor


def test_a_captured_step_writes_only_the_storages_that_outlive_it():
    # intermediates written in place inside the step die with it: the graph neither keeps them nor
    # writes them at each replay (a GPT step's program wrote 304 storages, 142 of them alive)
    from torchneuron.runtime import storages

    def step(x, w):
        hidden = x @ w
        hidden.add_(1)  # an intermediate written in place
        hidden.relu_()
        w.sub_(0.1 * hidden.sum())  # state the step updates
        return hidden.sum(1)

    f = torchneuron.capture(step)
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    xn, wn = x.to("neuron"), w.to("neuron")
    for _ in range(4):
        want = step(x, w)
        torch.testing.assert_close(f(xn, wn).cpu(), want)
        torch.testing.assert_close(wn.cpu(), w)
    graph = next(iter(f.graphs.values()))[0]
    assert len(graph.outputs) == 2  # the result and w: not the intermediate
    held = len(storages.table())
    f(xn, wn)
    assert len(storages.table()) <= held + 1  # (+ the new result)


def test_capture_records_again_for_a_new_shape():
    f = torchneuron.capture(lambda a, b: (a @ b).relu() + 1)
    for n in (3, 3, 3, 5, 5, 5):
        a, b = torch.randn(n, 4), torch.randn(4, 2)
        torch.testing.assert_close(f(a.to("neuron"), b.to("neuron")).cpu(), (a @ b).relu() + 1)
    assert f.recordings == 2 and f.replays == 2


@pytest.mark.parametrize("warmup", [0, 2])
def test_capture_records_after_the_warmup_calls_it_is_given(warmup):
    f = torchneuron.capture(lambda a, b: (a @ b).relu() + 1, warmup=warmup)
    seen = []
    for _ in range(warmup + 3):
        a, b = torch.randn(3, 4), torch.randn(4, 2)
        torch.testing.assert_close(f(a.to("neuron"), b.to("neuron")).cpu(), (a @ b).relu() + 1)
        seen.append((f.recordings, f.replays))
    assert seen == [(0, 0)] * warmup + [(1, 0), (1, 1), (1, 2)]
    with pytest.raises(ValueError, match="warmup"):
        torchneuron.capture(lambda a: a, warmup=-1)


def test_neuron_graph_replays_after_new_data_is_copied_into_static_inputs():
    want = _strict_losses()
    model, step = _gpt_step()
    static_x, static_y = DATA[0][0].clone(), DATA[0][1].clone()
    step(static_x, static_y)  # warm-up: the optimizer makes its state
    g = torch.neuron.NeuronGraph()
    params_before = [p.detach().clone() for p in model.parameters()]
    with torch.neuron.graph(g):
        static_loss = step(static_x, static_y)
    for p, before in zip(model.parameters(), params_before):  # capturing runs nothing, as on CUDA
        torch.testing.assert_close(p.detach(), before, rtol=0, atol=0)
    losses = [want[0]]
    for x, y in DATA[1:]:
        static_x.copy_(x)
        static_y.copy_(y)
        g.replay()
        losses.append(static_loss.cpu().clone())
    torch.testing.assert_close(torch.stack(losses), want, rtol=1e-5, atol=1e-6)


def test_random_ops_draw_anew_at_each_replay():
    x = torch.ones(1000, device="neuron")
    f = torchneuron.capture(lambda t: F.dropout(t, 0.5))
    masks = [f(x).cpu() for _ in range(4)]
    assert all(not torch.equal(masks[i], masks[i + 1]) for i in range(3))
    assert all(abs((m == 0).float().mean().item() - 0.5) < 0.1 for m in masks)


def test_a_host_sync_inside_a_capture_is_an_error_naming_it():
    x = torch.randn(4, device="neuron")
    g = torch.neuron.NeuronGraph()
    before = x.cpu()
    with pytest.raises(CaptureError, match="cannot wait for the device"), torch.neuron.graph(g):
        y = x * 2
        y.sum().item()
    torch.testing.assert_close(x.cpu(), before)
    with pytest.raises(CaptureError, match="data-dependent aten.nonzero"), torch.neuron.graph(g):
        (x * 2).nonzero()
    assert (x + 1).sum().item() == pytest.approx((before + 1).sum().item())  # the device works on


def test_make_graphed_callables_matches_eager_forward_and_backward():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to("neuron")
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    reference.load_state_dict({k: v.cpu() for k, v in module.state_dict().items()})
    sample = torch.randn(5, 8, device="neuron", requires_grad=True)
    graphed = torch.neuron.make_graphed_callables(module, (sample,))
    for _ in range(3):
        x = torch.randn(5, 8)
        xn = x.to("neuron").requires_grad_()
        xc = x.clone().requires_grad_()
        module.zero_grad()
        reference.zero_grad()
        out = graphed(xn)
        out.square().sum().backward()
        reference(xc).square().sum().backward()
        torch.testing.assert_close(out.detach().cpu(), reference(xc).detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(xn.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-5)
        for p, q in zip(module.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="captured for"):
        graphed(torch.randn(6, 8, device="neuron", requires_grad=True))


_CAPTURE_PROGRAM = """
import json, torch, torchneuron
torch.manual_seed(0)
w = torch.randn(6, 10).to("neuron")

@torchneuron.capture
def step(x):
    h = (x @ w.t()).view(3, 2, 3).transpose(0, 1)  # (views: host sizes and strides built into the graph)
    w.mul_(0.5)
    return (h * 1.25 + 0.5).tanh().sum(-1)

results = [step(torch.full((3, 10), float(i)).to("neuron")).cpu().tolist() for i in range(4)]
stats = torchneuron.cache_stats()
print(json.dumps({"results": results, "compiles": stats["compiles"], "disk_hits": stats["disk_hits"],
                  "untraced_loads": stats["untraced_loads"], "graphs": stats["entries_by_kind"].get("graph", 0),
                  "replays": step.replays}))
"""


def test_a_second_process_loads_a_captured_graph_without_tracing_it(tmp_path):
    """A captured graph has a persistent name (its plans' names and wiring, where its inputs come
    from, the host constants built into it), so a second process loads its executable from the
    cache untraced, as it does eager plans and fused segments, and replays it with the same results."""
    runs = cold, warm = runs_sharing_a_cache(_CAPTURE_PROGRAM, tmp_path)
    torch.manual_seed(0)
    w = torch.randn(6, 10)
    expected = []
    for i in range(4):
        h = (torch.full((3, 10), float(i)) @ w.t()).view(3, 2, 3).transpose(0, 1)
        w.mul_(0.5)
        expected.append((h * 1.25 + 0.5).tanh().sum(-1))
    for run in runs:
        assert run["graphs"] == 1 and run["replays"] == 2
        for got, want in zip(run["results"], expected):
            torch.testing.assert_close(torch.tensor(got), want)
    assert cold["compiles"] > 0
    assert warm["compiles"] == 0 and warm["untraced_loads"] == warm["disk_hits"] > 0


# ------------------------------------------------------------ optimizers' host numbers (capture_guards.py)
OPTIMIZERS = {  # built as users build them: capturable=False, learning rates as Python floats
    "adamw": lambda params: (torch.optim.AdamW(params, lr=1e-2), None),
    "adam": lambda params: (torch.optim.Adam(params, lr=1e-2), None),
    "sgd_momentum": lambda params: (torch.optim.SGD(params, lr=0.1, momentum=0.9), None),
    "adamw_step_lr": lambda params: _with_scheduler(torch.optim.AdamW(params, lr=1e-2)),
    "sgd_step_lr": lambda params: _with_scheduler(torch.optim.SGD(params, lr=0.1, momentum=0.9)),
}


def _with_scheduler(optimizer):
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=6, gamma=0.5)


def _default_optimizer_losses(kind, captured):
    torch.manual_seed(0)
    model = GPT().to("neuron")
    optimizer, scheduler = OPTIMIZERS[kind](model.parameters())

    def step(x, y):
        return train_step("gpt", model, optimizer, x, y).detach()

    if captured:
        step = torchneuron.capture(step)
    losses = []
    for x, y in DATA:
        losses.append(step(x, y))
        if scheduler is not None:
            scheduler.step()
    return torch.stack(losses).cpu(), step


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_capture_of_a_default_optimizer_trains_as_eager_for_20_steps(kind):
    want, _ = _default_optimizer_losses(kind, captured=False)
    if kind == "sgd_step_lr":  # a host learning rate changed at steps 6, 12 and 18: recorded again each time
        with pytest.warns(UserWarning, match=r"param_groups\[0\]\['lr'\] of SGD changed from 0.1 to 0.05"):
            got, step = _default_optimizer_losses(kind, captured=True)
        assert step.recordings == 4
    else:
        got, step = _default_optimizer_losses(kind, captured=True)
        assert step.recordings == 1 and step.replays == 18  # AdamW's learning rate: a device tensor
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_capture_of_a_non_capturable_optimizer_is_cudas_error():
    model, _ = _gpt_step()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = DATA[0]
    model(x, y).backward()
    optimizer.step()  # state made eagerly: step counts on the host
    g = torch.neuron.NeuronGraph()
    refused = "graph capture of step.. for an instance of AdamW but param_groups' capturable is False"
    with pytest.raises(RuntimeError, match=refused), torch.neuron.graph(g):
        model(x, y).backward()
        optimizer.step()
    with pytest.raises(RuntimeError, match="capturable is False"):
        torchneuron.capture(lambda: optimizer.step(), warmup=0)()


def test_neuron_graph_refuses_to_replay_after_a_learning_rate_changed():
    _model, step = _gpt_step()
    optimizer = step.optimizer
    x, y = DATA[0]
    step(x, y)
    g = torch.neuron.NeuronGraph()
    with torch.neuron.graph(g):
        step(x, y)
    g.replay()
    optimizer.param_groups[0]["lr"] = 5e-3
    with pytest.raises(RuntimeError, match=r"param_groups\[0\]\['lr'\] of AdamW changed from 0.01 to 0.005"):
        g.replay()


def test_make_graphed_callables_returns_the_module_which_runs_its_own_forward_in_the_other_mode():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).to("neuron")
    sample = torch.randn(4, 8, device="neuron", requires_grad=True)
    graphed = torch.neuron.make_graphed_callables(module, (sample,))
    assert graphed is module and list(graphed.parameters())  # still the module, as on CUDA
    module.eval()  # recorded in training: evaluation runs the module's forward, without dropout
    x = torch.randn(4, 8, device="neuron")
    torch.testing.assert_close(module(x).cpu(), module[0](x).cpu())


def test_make_graphed_callables_refuses_what_cuda_refuses():
    module = torch.nn.Linear(4, 4).to("neuron")
    sample = (torch.randn(2, 4, device="neuron"),)
    module.register_forward_hook(lambda *a: None)
    with pytest.raises(RuntimeError, match="must not have hooks"):
        torch.neuron.make_graphed_callables(module, sample)
    with pytest.raises(RuntimeError, match="only Tensors"):
        torch.neuron.make_graphed_callables(lambda x, n: x * n, (sample[0], 2))
    with torch.autocast("neuron", dtype=torch.bfloat16), pytest.raises(RuntimeError, match="autocast caching"):
        torch.neuron.make_graphed_callables(torch.nn.Linear(4, 4).to("neuron"), sample)


def test_capture_records_again_when_a_module_changes_training_mode():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).to("neuron")
    step = torchneuron.capture(lambda x: model(x) * 1.0, warmup=0)
    x = torch.randn(4, 8, device="neuron")
    step(x)
    step(x)
    model.eval()
    with pytest.warns(UserWarning, match="training mode of Sequential changed from True to False"):
        evaluated = step(x)  # recorded again: a replay would have applied dropout
    torch.testing.assert_close(evaluated.cpu(), model[0](x).cpu())
    torch.testing.assert_close(step(x).cpu(), model[0](x).cpu())  # and replayed
    assert step.recordings == 2
