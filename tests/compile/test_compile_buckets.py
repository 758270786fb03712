"""Shape buckets (compile/buckets.py, lowering/padding.py): dynamic graphs that reduce, take losses and
backpropagate over a padded axis run one executable per bucket, with CPU's results at every size."""
import pytest
import torch
import torch.nn.functional as F

from torchneuron.compile import compile_stats
from torchneuron.testing.models import GPT

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _compiles():
    return compile_stats().get("compiles", 0)


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


REDUCTIONS = {
    "sum": lambda x: (x.sum(1), x.sum(), x.sum((0, 1), keepdim=True), (x > 0).sum(1)),
    "mean": lambda x: (x.mean(1), x.mean(), x.mean((0, 1)), x.mean(0, keepdim=True)),
    "var_std": lambda x: (x.var(1), x.std(1, correction=0), *torch.var_mean(x, (0, 1), keepdim=True), x.var()),
    "max_min": lambda x: (x.amax(1), x.amin((0, 1)), x.argmax(1), x.argmin(1, keepdim=True), *x.max(1), *x.min(1),
                          (x * 100).long().amax(1), (x * 100).int().argmin(1)),
    "norm": lambda x: (torch.linalg.vector_norm(x, dim=1), torch.linalg.vector_norm(x, 1, dim=(0, 1)),
                       torch.linalg.vector_norm(x, float("inf"), dim=1)),
    "logsumexp_prod": lambda x: (x.logsumexp(1), (x / 4 + 1).prod(1)),
    "softmax": lambda x: torch.softmax(x, 1).mean(1) + x.sum(1),
    "rms_norm_over_padded_axis": lambda x: F.rms_norm(x, (x.shape[1],)),
    # pad-then-slice shifts left (HF's label shift): the last two positions become the pad value
    "shift_left": lambda x: (F.pad(x, (0, 2), value=-1.0)[:, 2:] * torch.arange(x.shape[1], device=x.device)).sum(1),
}


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions_over_the_padded_axis_match_cpu_with_one_executable_per_bucket(name):
    fn = REDUCTIONS[name]
    compiled = torch.compile(fn, backend="neuron", dynamic=True)
    before = _compiles()
    for n in (3, 9, 12, 16):
        x = torch.randn(5, n)
        for out, ref in zip(_flat(compiled(x.to("neuron"))), _flat(fn(x)), strict=True):
            torch.testing.assert_close(out.cpu(), ref)
    assert _compiles() - before <= 2  # buckets 8 and 16 of the length (the batch, 5, pads to 8)


class _Head(torch.nn.Module):
    """A linear head and a loss: parameters keep static shapes under dynamic=True, as in a model."""

    def __init__(self, loss):
        super().__init__()
        self.linear = torch.nn.Linear(8, 5)
        self.loss = loss

    def forward(self, x, y):
        return self.loss(x, y, self.linear.weight, self.linear.bias)


def _cross_entropy(x, y, w, b):
    return F.cross_entropy(F.linear(x, w, b), y, ignore_index=2, label_smoothing=0.1)


def _nll(x, y, w, b):
    return F.nll_loss(torch.log_softmax(F.linear(x, w, b), 1), y, ignore_index=0)


def _mse_mean(x, y, w, b):
    return F.mse_loss(F.linear(x, w, b), y)


def _mse_sum(x, y, w, b):
    return F.mse_loss(F.linear(x, w, b), y, reduction="sum")


def _norms(x, y, w, b):
    # layer and RMS norm over the static last axis: their weight gradients sum over the padded one
    h = F.layer_norm(F.linear(x, w, b), (5,), w[:, 0], b) * y
    return h.sum() + (F.rms_norm(x, (8,), w[0]).sum(1) * y[:, 0]).sum()


def _padding_never_leaks_inf(x, y, w, b):
    # padded rows of x are 0, so h is inf there (and 0 * inf NaN in the backward); true |h| <= 1
    h = 1 / (x.sign() * (x.abs() + 1))
    return ((h.t() @ h) @ w.t()).mean() + (F.linear(x, w, b) * y).sum()


LOSSES = {"cross_entropy": (_cross_entropy, "classes"), "nll": (_nll, "classes"), "mse_mean": (_mse_mean, "values"),
          "mse_sum": (_mse_sum, "values"), "norms": (_norms, "values"), "inf": (_padding_never_leaks_inf, "values")}


@pytest.mark.parametrize("name", LOSSES)
def test_losses_and_gradients_over_a_padded_batch_match_cpu(name):
    fn, targets = LOSSES[name]
    torch.manual_seed(0)
    cpu_head = _Head(fn)
    head = _Head(fn).to("neuron")
    head.load_state_dict(cpu_head.state_dict())
    compiled = torch.compile(head, backend="neuron", dynamic=True)
    g = torch.Generator().manual_seed(0)
    before = _compiles()
    for n in range(9, 17):
        x = torch.randn(n, 8, generator=g)
        y = torch.randint(0, 5, (n,), generator=g) if targets == "classes" else torch.randn(n, 5, generator=g)
        losses, grads = [], []
        for model, run, device in ((cpu_head, cpu_head, "cpu"), (head, compiled, "neuron")):
            model.zero_grad()
            leaf = x.clone().to(device).requires_grad_()
            loss = run(leaf, y.to(device))
            loss.backward()
            losses.append(loss.cpu())
            grads.append([leaf.grad.cpu()] + [p.grad.cpu() for p in model.parameters()])
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
        for out, ref in zip(*reversed(grads), strict=True):
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert _compiles() - before <= 2  # bucket 16: one forward and one backward executable


def test_gpt_training_over_lengths_3_to_64_matches_cpu_with_one_executable_per_bucket():
    torch.manual_seed(0)
    cpu_model = GPT(context=64)
    model = GPT(context=64).to("neuron")
    model.load_state_dict(cpu_model.state_dict())
    compiled = torch.compile(model, backend="neuron", dynamic=True)
    g = torch.Generator().manual_seed(0)
    before = _compiles()
    for t in (3, 9, 17, 33, 64, 5):
        seq = torch.randint(0, 64, (2, t + 1), generator=g)
        cpu_model.zero_grad()
        model.zero_grad()
        expected = cpu_model(seq[:, :-1], seq[:, 1:])
        expected.backward()
        loss = compiled(seq[:, :-1].to("neuron"), seq[:, 1:].to("neuron"))
        loss.backward()
        torch.testing.assert_close(loss.cpu(), expected, rtol=1e-4, atol=1e-5)
        for (name, p_cpu), p in zip(cpu_model.named_parameters(), model.parameters()):
            torch.testing.assert_close(p.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert _compiles() - before <= 2 * 4  # forward and backward, buckets 8, 16, 32, 64


REFUSED = {
    "slice": lambda x: (x[:, 1:] - x[:, :-1]).sum(1),  # indexing along the padded axis
    "size_as_value": lambda x: x * x.shape[1],
    "layer_norm_over_padded_axis": lambda x: F.layer_norm(x, (x.shape[1],)),
    "cumsum_flip": lambda x: x.flip(1).cumsum(1),
    "argmax_of_flattened": lambda x: x.argmax(),
    "shift_right": lambda x: F.pad(x, (1, 0), value=-1.0)[:, :-1].sum(1),
    "write_into_partial_slice": lambda x: torch.cat([x[:, :1], torch.zeros_like(x[:, 1:])], 1).sum(1),
}


@pytest.mark.parametrize("name", REFUSED)
def test_ops_not_shown_safe_keep_exact_shapes(name):
    fn = REFUSED[name]
    compiled = torch.compile(fn, backend="neuron", dynamic=True)
    before = _compiles()
    for n in (3, 5, 6):
        x = torch.randn(4, n)
        torch.testing.assert_close(compiled(x.to("neuron")).cpu(), fn(x))
    assert _compiles() - before == 3  # one executable per length


def test_a_new_length_in_a_known_bucket_compiles_only_its_small_adapters():
    # The graphs run at the bucket size; what a new true length needs is padding its inputs and
    # slicing its outputs: one small executable each per graph (not a compile per tensor).
    import jax

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration"
        else None)
    torch.manual_seed(0)
    model = GPT(context=64).to("neuron")

    def step(idx, targets):
        loss = model(idx, targets)
        loss.backward()
        return loss

    compiled = torch.compile(step, backend="neuron", dynamic=True)
    per_length = []
    for n in (9, 10, 11, 12):  # one bucket (16)
        before = len(compiles)
        idx = torch.randint(0, 64, (4, n)).to("neuron")
        compiled(idx, torch.roll(idx, -1, 1)).item()
        torch.neuron.synchronize()  # (fused eager: the gradients' accumulation runs at this length)
        per_length.append(len(compiles) - before)
    # forward and backward: a pad and an unpad executable each; eager randint/roll of the new shape
    assert max(per_length[2:]) <= 8, per_length
