"""The eager driver's one-pass path for the common call (positional tensors on one device) and
its general path must agree: same values as CPU, same plans, same errors."""
import pytest
import torch

from torchneuron import config
from torchneuron.eager import driver
from torchneuron.eager.schema import parse

aten = torch.ops.aten


@pytest.mark.parametrize("make", [
    lambda x: (x, x),                                 # one storage twice
    lambda x: (x[::2], x[1::2]),                      # two views of one storage
    lambda x: (x.view(4, 4).t(), x.view(4, 4)),       # transposed view
    lambda x: (torch.nn.Parameter(x), x * 2),         # a parameter takes the same path
])
def test_common_call_matches_cpu(make):
    base = torch.randn(16)
    expected = torch.add(*make(base))
    got = torch.add(*make(base.to("neuron")))
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), expected)


def test_both_paths_find_the_same_plan(monkeypatch):
    # (at exact sizes: an earlier test's calls of mul at other sizes would have this one run padded)
    monkeypatch.setattr(config, "EAGER_BUCKETS", False)
    a, b = torch.randn(5, 3).to("neuron"), torch.randn(5, 3).t().to("neuron")
    schema, plans = parse(aten.mul.Tensor), driver.plans_of(aten.mul.Tensor)
    with torch.profiler.profile():  # the profiler runs every call through the general path
        c = a * b.t()
    # the one-pass path finds the plan the general path built: it runs without building another
    n = len(plans)
    d = driver._run_in_one_pass(schema, plans, (a, b.t()), {})
    assert d is not None and len(plans) == n
    torch.testing.assert_close(d.cpu(), c.cpu())
    torch.testing.assert_close(c.cpu(), a.cpu() * b.t().cpu())


def test_common_call_on_second_core_and_device_mix():
    a = torch.randn(4).to("neuron:1")
    assert (a + a).device == torch.device("neuron:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.randn(4).to("neuron:0")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.randn(4)
    # a 0-dim CPU tensor takes part as a scalar, as on CUDA
    torch.testing.assert_close((a + torch.tensor(2.0)).cpu(), a.cpu() + 2)


def test_common_call_reads_never_written_and_resized_storages():
    e = torch.empty(6, device="neuron")  # never written: read as zeros by the general path
    assert torch.equal((e * 0).cpu(), torch.zeros(6))
    out = torch.zeros(2, device="neuron")
    out.resize_(8)
    out[2:] = 1
    torch.testing.assert_close((out + out).cpu()[2:], torch.full((6,), 2.0))


def test_conjugate_views_reach_mm_resolved():
    a = torch.randn(3, 3, dtype=torch.complex64)
    b = torch.randn(3, 3, dtype=torch.complex64)
    got = torch.mm(a.to("neuron").conj(), b.to("neuron"))
    torch.testing.assert_close(got.cpu(), torch.mm(a.conj(), b))


@pytest.mark.parametrize("scalar", [2.5, 3, torch.tensor(1.5), torch.tensor(2)])
@pytest.mark.parametrize("op", ["mul", "add", "sub_", "div"])
def test_python_scalars_take_the_one_pass_path_to_the_general_paths_plan(op, scalar, monkeypatch):
    monkeypatch.setattr(config, "EAGER_BUCKETS", False)  # (a call the general path runs padded plans nothing)
    # `x * 2.5` reaches the driver with the Python scalar (or a 0-dim CPU tensor) beside the tensor;
    # both paths key it alike, so the one-pass path runs the plan the general path built
    x = torch.randn(6)
    fn = (lambda t, s: getattr(t, op)(s))
    expected = fn(x.clone(), scalar)
    on_neuron = x.to("neuron")
    with torch.profiler.profile():  # the profiler runs every call through the general path
        first = fn(on_neuron.clone(), scalar)
    schema = parse(getattr(aten, op).Tensor)
    plans = driver.plans_of(getattr(aten, op).Tensor)
    n = len(plans)
    target = on_neuron.clone()
    got = driver._run_in_one_pass(schema, plans, (target, scalar), {})
    assert got is not None and len(plans) == n
    torch.testing.assert_close((target if op.endswith("_") else got).cpu(), expected)
    torch.testing.assert_close(first.cpu(), expected)


def test_a_bool_scalar_takes_the_one_pass_path():
    x = torch.randn(6)
    on_neuron = x.to("neuron")
    with torch.profiler.profile():
        on_neuron * True
    plans = driver.plans_of(aten.mul.Tensor)
    got = driver._run_in_one_pass(parse(aten.mul.Tensor), plans, (on_neuron, False), {})
    assert got is not None
    torch.testing.assert_close(got.cpu(), x * False)


def _attention_on_cpu(q, k, v, scale):
    return (torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale),)


@pytest.mark.parametrize("op, args, kwargs, reference", [
    (aten.gelu.default, lambda x: (x,), {"approximate": "tanh"}, None),  # a keyword-only static argument
    (aten.nll_loss_forward.default,  # an absent optional tensor among the leading operands
     lambda x: (x.log_softmax(-1), torch.tensor([1, 0, 3, 2, 1]).to(x.device), None, 1, -100), {}, None),
    (aten._scaled_dot_product_fused_attention_overrideable.default,  # (the dispatcher drops the defaults)
     lambda x: (x.view(1, 1, 5, 4), x.view(1, 1, 5, 4) * 2, x.view(1, 1, 5, 4) + 1), {"scale": 0.5},
     _attention_on_cpu),
])
def test_absent_operands_and_static_keywords_take_the_one_pass_path_to_the_general_paths_plan(
        op, args, kwargs, reference, monkeypatch):
    monkeypatch.setattr(config, "EAGER_BUCKETS", False)
    x = torch.randn(5, 4)
    on_neuron = x.to("neuron")
    with torch.profiler.profile():  # the profiler runs every call through the general path
        first = op(*args(on_neuron), **kwargs)
    plans = driver.plans_of(op)
    n = len(plans)
    got = driver._run_in_one_pass(parse(op), plans, args(on_neuron), kwargs)
    assert got is not None and len(plans) == n  # keyed alike: the general path's plan ran
    expected = reference(*args(x), **kwargs) if reference else op(*args(x), **kwargs)
    as_tuple = (lambda r: r if isinstance(r, tuple) else (r,))
    for g, f, e in zip(as_tuple(got), as_tuple(first), as_tuple(expected)):
        if e.numel():
            torch.testing.assert_close(g.cpu(), e)
            torch.testing.assert_close(f.cpu(), e)


@pytest.mark.parametrize("op, args, kwargs", [
    (aten.arange.default, (7,), {"dtype": torch.int64}),  # (its scalar keys the plan: a static scalar)
    (aten.full.default, ([2, 3], 1.5), {"dtype": torch.float32}),  # a traced scalar after a static size
    (aten.full.default, ([4], True), {"dtype": torch.bool}),
    (aten.scalar_tensor.default, (-float("inf"),), {"dtype": torch.float32}),
])
@pytest.mark.parametrize("index", [0, 1])
def test_factories_take_the_one_pass_path_to_the_general_paths_plan(op, args, kwargs, index):
    """A call without tensors, its device a keyword: keyed as the general path keys it, on the
    device it names, values as on CPU (a traced fill value read anew per call)."""
    device = torch.device("neuron", index)
    with torch.profiler.profile():  # the profiler runs every call through the general path
        first = op(*args, **kwargs, device=device)
    plans = driver.plans_of(op)
    n = len(plans)
    again = list(args)
    if op is aten.full.default:
        again[1] = 0.25 if again[1] is not True else False
    got = driver._run_in_one_pass(parse(op), plans, tuple(again), {**kwargs, "device": device})
    assert got is not None and len(plans) == n and got.device == device == first.device
    assert got.dtype == first.dtype == kwargs["dtype"]
    torch.testing.assert_close(first.cpu(), op(*args, **kwargs))
    torch.testing.assert_close(got.cpu(), op(*again, **kwargs))


def test_a_factory_without_a_plan_for_its_device_builds_one():
    torch.full([3], 2.0, device="neuron:0")
    on_one = torch.full([3], 2.0, device="neuron:1")
    assert on_one.device == torch.device("neuron", 1)
    torch.testing.assert_close(on_one.cpu(), torch.full([3], 2.0))


@pytest.mark.parametrize("make", [lambda: torch.full([2], 1.5, device="neuron"),
                                  lambda: torch.arange(3, device="neuron"),
                                  lambda: torch.zeros(2, device="neuron")])
def test_a_factory_on_neuron_without_an_index_runs_on_the_current_device(make):
    """As on CUDA: device="neuron" means the current device, whichever made the plan first."""
    expected = make().cpu()
    try:
        for index in (0, 1, 0, 1):
            torch.neuron.set_device(index)
            made = make()
            assert made.device == torch.device("neuron", index)
            torch.testing.assert_close(made.cpu(), expected)
    finally:
        torch.neuron.set_device(0)


def test_a_keyword_tensor_leaves_the_call_to_the_general_path():
    x = torch.randn(3).to("neuron")
    x + x  # (a plan for the positional call)
    assert driver._run_in_one_pass(parse(aten.add.Tensor), driver.plans_of(aten.add.Tensor), (x,),
                                   {"other": x}) is None
    torch.testing.assert_close(torch.add(x, other=x).cpu(), x.cpu() * 2)


def test_a_written_cpu_scalar_tensor_is_still_a_device_mix():
    with pytest.raises(RuntimeError, match="same device"):
        torch.tensor(1.0).add_(torch.ones((), device="neuron"))
