"""Device-side asserts: an index out of bounds raises, as on CUDA, a RuntimeError naming the op at
the next synchronisation (at the op itself with TORCHNEURON_LAUNCH_BLOCKING=1), where CPU raises at
the op; in-bounds indices (negative ones where PyTorch allows them) give CPU's results."""
import pathlib

import pytest
import torch
import torch.nn.functional as F

import torchneuron
from torchneuron.runtime.device_asserts import DeviceAssertError
from torchneuron.testing.processes import run_code


def _x(*shape):
    return torch.arange(float(torch.Size(shape).numel())).reshape(shape)


def _i(*values):
    return torch.tensor(values)


# name -> (fn(x, i) -> tensor, x, (bad index, the op the message names), good index)
CASES = {
    "index": (lambda x, i: x[i], _x(3, 2), _i(5), "aten.index.Tensor", _i(-3, 2)),
    "index_2nd_dim": (lambda x, i: x[:, i], _x(3, 2), _i(0, 2), "aten.index.Tensor", _i(-1, 1)),
    "index_put_": (lambda x, i: x.index_put_((i,), x.new_ones(())), _x(4), _i(4), "aten.index_put", _i(-4)),
    "setitem": (lambda x, i: x.__setitem__(i, 7.0) or x, _x(4), _i(9), "aten.index_put", _i(1, -1)),
    "index_select": (lambda x, i: x.index_select(0, i), _x(3, 2), _i(3), "aten.index_select", _i(2, 0)),
    "index_add": (lambda x, i: x.index_add(0, i, x.new_ones(1, 2)), _x(3, 2), _i(-1), "aten.index_add", _i(1)),
    "index_copy": (lambda x, i: x.index_copy(0, i, x.new_ones(1, 2)), _x(3, 2), _i(3), "aten.index_copy", _i(0)),
    "index_fill": (lambda x, i: x.index_fill(1, i, -1.0), _x(3, 2), _i(2), "aten.index_fill", _i(-2)),
    "gather": (lambda x, i: x.gather(0, i.view(1, 1)), _x(3, 2), _i(3), "aten.gather", _i(2)),
    "scatter": (lambda x, i: x.scatter(0, i.view(1, 1), 5.0), _x(3, 2), _i(-1), "aten.scatter", _i(1)),
    "scatter_add": (lambda x, i: x.scatter_add(1, i.view(1, 1), x.new_ones(1, 1)), _x(3, 2), _i(2),
                    "aten.scatter_add", _i(1)),
    "take": (lambda x, i: x.take(i), _x(3, 2), _i(6), "aten.take", _i(-6, 5)),
    "embedding": (lambda x, i: F.embedding(i, x), _x(3, 2), _i(0, 3), "aten.embedding", _i(2, 0)),
    "one_hot": (lambda x, i: F.one_hot(i, 3), _x(1), _i(0, 3), "aten.scatter", _i(2, 0)),
    "cross_entropy": (lambda x, i: F.cross_entropy(x, i), _x(2, 3), _i(0, 3), "aten.nll_loss_forward", _i(2, -100)),
}


def _on(device, x, i):
    return x.clone().to(device), i.to(device)


@pytest.mark.parametrize("name", CASES)
def test_out_of_bounds_raises_at_the_next_synchronisation(name):
    fn, x, bad, op, _ = CASES[name]
    with pytest.raises((IndexError, RuntimeError)):
        fn(*_on("cpu", x, bad))  # the reference: CPU refuses the index at the op
    result = fn(*_on("neuron", x, bad))  # the device cannot stop: the op returns
    with pytest.raises(RuntimeError, match=f"device-side assert triggered: {op}.*out of bounds"):
        result.cpu()
    torch.neuron.synchronize()  # reported once: the next synchronisation is clean


@pytest.mark.parametrize("name", CASES)
def test_in_bounds_indices_match_cpu(name):
    fn, x, _, _, good = CASES[name]
    expected = fn(*_on("cpu", x, good))
    got = fn(*_on("neuron", x, good))
    torch.testing.assert_close(got.cpu(), expected)
    torch.neuron.synchronize()


def test_synchronize_and_item_raise_it_too():
    x, i = _on("neuron", _x(4), _i(4))
    x.gather(0, i)
    with pytest.raises(DeviceAssertError, match="aten.gather"):
        torch.neuron.synchronize()
    y = x.gather(0, i)
    with pytest.raises(DeviceAssertError):
        y.sum().item()


def test_compiled_graph_names_the_op():
    f = torch.compile(lambda x, i: (x.gather(0, i) * 2).sum(), backend="neuron")
    x, i = _on("neuron", _x(4), _i(0, 3))
    assert f(x, i).item() == 6.0
    out = f(x, torch.tensor([0, 9]).to("neuron"))
    with pytest.raises(DeviceAssertError, match="aten.gather.default: index out of bounds for size 4"):
        out.cpu()


def test_training_step_with_good_targets_raises_nothing():
    """Every index of a training step (embedding, targets) is checked, and none fires: the step
    synchronises without an error and computes CPU's loss and gradients."""
    from torchneuron.testing.models import GPT
    torch.manual_seed(0)
    reference = GPT(vocab=16, width=8, heads=2, layers=1, context=8)
    model = GPT(vocab=16, width=8, heads=2, layers=1, context=8).to("neuron")
    model.load_state_dict(reference.state_dict())
    idx = torch.randint(0, 16, (2, 8))
    loss = model(idx.to("neuron"), idx.to("neuron"))
    loss.backward()
    torch.neuron.synchronize()
    expected = reference(idx, idx)
    expected.backward()
    torch.testing.assert_close(loss.cpu(), expected, rtol=1e-5, atol=1e-5)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5)


_SCRIPT = """
import torch, torchneuron
x = torch.ones(3).to("neuron")
i = torch.tensor([7]).to("neuron")
try:
    y = x[i]
    print("returned")
    y.cpu()
    print("no error")
except RuntimeError as e:
    print("raised:", e)
"""


@pytest.mark.parametrize("env, expected", [
    ({"TORCHNEURON_LAUNCH_BLOCKING": "1"}, "raised: neuron: device-side assert triggered: aten.index.Tensor"),
    ({"TORCHNEURON_DEVICE_ASSERTS": "0"}, "returned\nno error"),
])
def test_settings(env, expected):
    out = run_code(_SCRIPT, env=env, cwd=pathlib.Path(__file__).parents[2], ok=False)
    assert out.stdout.strip().startswith(expected), out.stdout + out.stderr


def test_a_second_process_with_a_warm_cache_names_the_failure(tmp_path):
    """A checking op's program is stored and loaded by name like any other: message ids are the
    same in every process, and the messages travel with the program. The second process traces
    another check first (a per-process numbering would give the index check another id) and loads
    the index program untraced."""
    first = ("import torch, torchneuron\n"
             "x = torch.arange(5.).to('neuron'); i = torch.tensor([1, 7]).to('neuron')\n")
    second = ("import torch, torchneuron\n"
              "x = torch.arange(5.).to('neuron'); i = torch.tensor([1, 7]).to('neuron')\n"
              "x.gather(0, torch.tensor([4]).to('neuron')).cpu()\n")
    check = ("try:\n    x[i]; torch.neuron.synchronize()\nexcept RuntimeError as e:\n    print(e)\n"
             "print('untraced', torchneuron.cache_stats()['untraced_loads'])\n")
    untraced = []
    for code in (first, second):
        out = run_code(code + check, env={"TORCHNEURON_CACHE_DIR": str(tmp_path)}, timeout=120, ok=False)
        assert "aten.index.Tensor: index along dimension 0 out of bounds for size 5" in out.stdout, out.stdout + out.stderr[-2000:]
        untraced.append(int(out.stdout.split("untraced")[-1]))
    assert untraced[0] == 0 and untraced[1] >= 1


def test_assert_async_is_checked_on_the_device_without_a_host_sync(no_fallback):
    """torch._assert_async (torchtitan asserts in every forward) runs in the step's program: a
    recorded step may hold it (a host sync there raises), and a false one raises later."""
    x = torch.ones(3, device="neuron")

    def step(x):
        torch._assert_async(x.sum() > 0, "sum must be positive")
        return x * 2

    captured = torchneuron.capture(step, warmup=0)
    captured(x)  # recorded: no sync inside
    torch.testing.assert_close(captured(x).cpu(), torch.full((3,), 2.0))
    for bad in (lambda: step(-x), lambda: captured(-x)):
        bad()
        with pytest.raises(RuntimeError, match="aten._assert_async.msg: sum must be positive"):
            torch.neuron.synchronize()
    torch._assert_async(torch.tensor(0.0, device="neuron"))
    with pytest.raises(RuntimeError, match="Expected Tensor with single nonzero value, but got zero"):
        torch.neuron.synchronize()


def test_assert_async_refuses_what_cpu_refuses():
    for values in (torch.ones(2), torch.ones(0)):
        with pytest.raises(RuntimeError) as on_cpu:
            torch._assert_async(values)
        with pytest.raises(RuntimeError, match=str(on_cpu.value)):
            torch._assert_async(values.to("neuron"))


def test_compiled_assert_async_raises_with_its_message():
    step = torch.compile(lambda x: (torch._assert_async(x.sum() > 0, "positive"), x * 2)[1], backend="neuron")
    torch.testing.assert_close(step(torch.ones(3, device="neuron")).cpu(), torch.full((3,), 2.0))
    step(-torch.ones(3, device="neuron"))
    with pytest.raises(RuntimeError, match="positive"):
        torch.neuron.synchronize()
