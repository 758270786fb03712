"""torch.compile(backend="neuron"): one XLA executable per graph, same results as eager and CPU."""
import functools

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import torchneuron
from tests.reference import check
from torchneuron.compile import compile_stats
from torchneuron.testing.float64 import shadowed_training
from torchneuron.testing.models import CNN, GPT, MLP, batches, loss_of, train_step

pytestmark = pytest.mark.usefixtures("fresh_dynamo")



def _train_step(kind, model, opt, x, y):
    loss = loss_of(kind, model, x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def _inputs(kind):
    return next(iter(batches(kind, 1, batch=4)))


@pytest.mark.parametrize("kind,model_cls", [("mlp", MLP), ("cnn", CNN), ("gpt", GPT)])
def test_compiled_forward_and_backward_match_eager_and_cpu(kind, model_cls, monkeypatch):
    monkeypatch.setattr(torchneuron.config, "FALLBACK", "error")
    torch.manual_seed(0)
    cpu_model = model_cls()
    eager_model = model_cls().to("neuron")
    eager_model.load_state_dict(cpu_model.state_dict())
    compiled_model = model_cls().to("neuron")
    compiled_model.load_state_dict(cpu_model.state_dict())
    compiled = torch.compile(compiled_model, backend="neuron")
    x, y = _inputs(kind)
    losses = []
    for model, device in ((cpu_model, "cpu"), (eager_model, "neuron"), (compiled, "neuron")):
        loss = loss_of(kind, model, x.to(device), y.to(device))
        loss.backward()
        losses.append(loss.item())
    torch.testing.assert_close(losses[2], losses[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses[2], losses[1], rtol=1e-5, atol=1e-6)
    for (name, p_cpu), p_compiled in zip(cpu_model.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(p_compiled.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-5, msg=name)
    # BatchNorm running statistics are graph input mutations: they must land in the real buffers
    for (name, b_cpu), b_compiled in zip(cpu_model.named_buffers(), compiled_model.buffers()):
        torch.testing.assert_close(b_compiled.cpu(), b_cpu, rtol=1e-5, atol=1e-6, msg=name)
    assert compile_stats()["compiles"] >= 2  # a forward and a backward executable
    assert compile_stats().get("eager_graphs", 0) == 0


@pytest.mark.parametrize("rank,padding,k,kw", [
    (1, "valid", 3, {"stride": 2}), (2, "valid", 2, {"groups": 2, "dilation": 2}), (3, "valid", 3, {}),
    (1, "same", 2, {"dilation": 3}), (2, "same", 2, {}), (2, "same", 3, {"groups": 2, "dilation": 2}),
    (3, "same", 2, {"groups": 2}),
])
def test_compiled_conv_string_padding(rank, padding, k, kw):
    # AOTAutograd decomposes conv*d(padding=str) to aten.convolution with padding [0] ("valid") or
    # a constant_pad_nd of the input plus explicit pads ("same" with an even kernel)
    conv = (F.conv1d, F.conv2d, F.conv3d)[rank - 1]
    x = torch.randn((2, 4) + (6,) * rank, dtype=torch.float64)
    w = torch.randn((6, 4 // kw.get("groups", 1)) + (k,) * rank, dtype=torch.float64)
    fn = torch.compile(lambda x, w, b: conv(x, w, b, padding=padding, **kw), backend="neuron")
    eager_graphs = compile_stats().get("eager_graphs", 0)
    check(fn, x, w, torch.randn(6, dtype=torch.float64), grad=True)
    assert compile_stats().get("eager_graphs", 0) == eager_graphs  # each graph was one executable


def test_compiled_training_step_matches_eager():
    torch.manual_seed(0)
    eager_model = GPT().to("neuron")
    compiled_model = GPT().to("neuron")
    compiled_model.load_state_dict(eager_model.state_dict())
    # SGD: Adam would turn rounding noise in zero gradients (attention key bias) into full steps
    opts = [torch.optim.SGD(m.parameters(), lr=1e-1, momentum=0.9) for m in (eager_model, compiled_model)]

    step = functools.partial(_train_step, "gpt")
    compiled_step = torch.compile(step, backend="neuron")
    for x, y in batches("gpt", 3, batch=4):
        x, y = x.to("neuron"), y.to("neuron")
        a = step(eager_model, opts[0], x, y)
        b = compiled_step(compiled_model, opts[1], x, y)
        torch.testing.assert_close(b.cpu(), a.cpu(), rtol=1e-4, atol=1e-5)
    for pa, pb in zip(eager_model.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(pb.cpu(), pa.cpu(), rtol=1e-4, atol=1e-5)


def test_compiled_adamw_keeps_step_counts_on_neuron_and_matches_cpu():
    """As Dynamo does for CUDA: a compiled optimizer without state is made capturable, so its
    step counts live on the device; each compiled step is as close to CPU's non-capturable AdamW in
    float64 as CPU's in float32 (testing/float64.py: curves of two float32 runs drift by machine).
    PyTorch's capturable AdamW (CPU cannot run it) computes the bias corrections as float32 tensors
    where the non-capturable one uses Python floats: ~5 float32 roundings of the parameters (eager
    capturable AdamW on neuron too), hence a floor of 10."""
    errors = shadowed_training("mlp", 4, "adamw", step=torch.compile(train_step, backend="neuron"))
    assert errors.failures(ulps=10) == []
    opt = errors.optimizer
    assert opt.param_groups[0]["capturable"]
    for p in errors.model.parameters():
        assert opt.state[p]["step"].device.type == "neuron"
        assert opt.state[p]["step"].item() == 4


def test_compiled_outputs_stay_on_each_inputs_core():
    compiled = torch.compile(lambda x: (x * 2, x.sum()), backend="neuron")
    for device in ("neuron:0", "neuron:1", "neuron:0"):
        x = torch.arange(6.0).to(device)
        doubled, total = compiled(x)
        assert doubled.device == total.device == torch.device(device)
        torch.testing.assert_close(doubled.cpu(), torch.arange(6.0) * 2)
        assert total.item() == 15.0


def test_output_that_is_an_input_buffer_gets_its_own_storage():
    # clone's value is its input's: the executable hands the input buffer back, and the output
    # tensor must not share it (every call, not only the first)
    compiled = torch.compile(lambda x: (x.clone(), x + 1), backend="neuron")
    x = torch.arange(4.0).to("neuron")
    for _ in range(2):
        y, z = compiled(x)
        y.mul_(10)
        torch.testing.assert_close(x.cpu(), torch.arange(4.0))
        torch.testing.assert_close(y.cpu(), torch.arange(4.0) * 10)
        torch.testing.assert_close(z.cpu(), torch.arange(4.0) + 1)


def test_graph_break_runs_on_neuron(monkeypatch):
    monkeypatch.setattr(torchneuron.config, "FALLBACK", "error")

    def fn(x):
        y = torch.relu(x) * 2
        torch._dynamo.graph_break()
        return (y + 1).sum()

    x = torch.randn(8)
    out = torch.compile(fn, backend="neuron")(x.to("neuron"))
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), fn(x))


def test_inference_input_mutation_lands_in_storage():
    def fn(x, buf):
        buf.add_(x)
        return buf * 2

    x = torch.randn(5).to("neuron")
    buf = torch.zeros(5).to("neuron")
    out = torch.compile(fn, backend="neuron")(x, buf)
    torch.testing.assert_close(buf.cpu(), x.cpu())
    torch.testing.assert_close(out.cpu(), 2 * x.cpu())


def test_views_at_new_storage_offsets_reuse_the_executable():
    # a sampling loop passes `timesteps[i]`: the same view at a new offset every step
    def fn(row, column, acc):
        acc.add_(row * column.sum())
        return row + 1

    table, buf = torch.randn(4, 4), torch.zeros(4, 4)
    table_n, buf_n = table.to("neuron"), buf.to("neuron")
    compiled = torch.compile(fn, backend="neuron")
    before = compile_stats().get("compiles", 0)
    for i in range(4):
        out = compiled(table_n[i], table_n[:, i], buf_n[i])
        torch.testing.assert_close(out.cpu(), fn(table[i], table[:, i], buf[i]))
    torch.testing.assert_close(buf_n.cpu(), buf)
    assert compile_stats()["compiles"] - before <= 2  # offset 0, then any offset as an argument


def test_host_input_mutations_land_in_host_tensors():
    # CPU inputs a graph mutates (an optimizer's step counts): of several shapes and dtypes, each
    # dtype crossing as one array and back
    def fn(x, counts, step, scale):
        counts.add_(x[:3].cpu())
        step.add_(1)
        scale.mul_(2)
        return x * 2

    x = torch.randn(5).to("neuron")
    # (a 0-d float64 scale would not do: AOTAutograd itself drops that mutation in torch 2.13, aot_eager too)
    counts, step, scale = torch.zeros(3), torch.tensor(4), torch.tensor([1.5, 2.0], dtype=torch.float64)
    compiled = torch.compile(fn, backend="neuron")
    for i in range(2):
        out = compiled(x, counts, step, scale)
    torch.testing.assert_close(out.cpu(), 2 * x.cpu())
    torch.testing.assert_close(counts, 2 * x[:3].cpu())
    assert step.item() == 6 and step.dtype == torch.int64
    torch.testing.assert_close(scale, torch.tensor([6.0, 8.0], dtype=torch.float64))


def test_recompiles_are_counted_with_reasons():
    fn = torch.compile(lambda x: (x * 2).sum(), backend="neuron", dynamic=False)
    for n in (4, 4, 6):
        fn(torch.randn(n).to("neuron"))
    stats = compile_stats()
    assert stats["cache_hits"] >= 1


def test_dynamic_sequence_lengths_compile_a_bounded_number_of_times():
    torch.manual_seed(0)
    model = GPT().to("neuron").eval()
    compiled = torch.compile(model, backend="neuron", dynamic=True)
    before = compile_stats().get("compiles", 0)
    for t in (3, 5, 6, 8, 9, 11, 13, 16):
        idx = torch.randint(0, 64, (2, t))
        with torch.no_grad():
            out = compiled(idx.to("neuron"))
            ref = model(idx.to("neuron"))
        torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-4, atol=1e-5)
    # one executable per power-of-two bucket of each dynamic size (docs/COMPILE.md)
    assert compile_stats()["compiles"] - before <= 2  # buckets 8 and 16 (batch 2 pads to 8)


def test_padding_unsafe_graphs_keep_exact_shapes():
    # flipping along the dynamic axis moves padding in front of the data: no bucketing, one
    # executable per length (reductions over it are bucketed: tests/compile/test_compile_buckets.py)
    def fn(x):
        return torch.softmax(x, 1).flip(1) + x.sum(1, keepdim=True)

    compiled = torch.compile(fn, backend="neuron", dynamic=True)
    before = compile_stats().get("compiles", 0)
    for n in (3, 5, 6):
        x = torch.randn(2, n)
        torch.testing.assert_close(compiled(x.to("neuron")).cpu(), fn(x))
    assert compile_stats()["compiles"] - before == 3


def test_a_backward_run_op_by_op_gets_its_saved_tensors_at_their_traced_strides(monkeypatch):
    """A graph with an op the table lacks runs as eager neuron ops; the compiled forward hands its
    saved tensors over contiguous, while the backward was traced with them transposed (a `view`
    valid for the traced strides failed on the contiguous ones)."""
    from torchneuron.compile import backend

    lowered = backend._unsupported

    def backward_lacks_an_op(gm):
        is_backward = any(n.op == "placeholder" and n.name.startswith("tangents") for n in gm.graph.nodes)
        return ["(a test's missing op)"] if is_backward else lowered(gm)

    monkeypatch.setattr(backend, "_unsupported", backward_lacks_an_op)
    # (the count goes back afterwards: other tests assert that no real graph ran op by op)
    monkeypatch.setitem(backend.STATS, "eager_graphs", backend.STATS.get("eager_graphs", 0))

    def attention(x, w):
        q = (x @ w).view(2, 8, 4, 16)
        q = (q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6)).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q).sum()

    x, w = torch.randn(2, 8, 64), torch.randn(64, 64)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    attention(xc, wc).backward()
    xn, wn = x.to("neuron").requires_grad_(), w.to("neuron").requires_grad_()
    eager_graphs = compile_stats().get("eager_graphs", 0)
    torch.compile(attention, backend="neuron")(xn, wn).backward()
    assert compile_stats().get("eager_graphs", 0) == eager_graphs + 1
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(wn.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-4)


def test_a_graph_without_neuron_inputs_runs_on_the_core_its_tensors_name():
    # a graph of factories has no input to say where it runs: its tensors' device does (it ran on,
    # and reported, the current core)
    from torchneuron.runtime import storages
    f = torch.compile(lambda: torch.arange(5, device="neuron:1") * 2, backend="neuron")
    out = f()
    assert out.device == torch.device("neuron", 1)
    assert [d.id for d in storages.buffer_of(out).devices()] == [1]
    torch.testing.assert_close(out.cpu(), torch.arange(5) * 2)
