import pytest
import torch

from tests.reference import assert_same, to_neuron

pytestmark = pytest.mark.usefixtures("no_fallback")


def tensors(dtype=torch.float32, positive=False):
    xs = [torch.randn(3, 4), torch.randn(5), torch.randn(()), torch.randn(4, 3).t()]
    xs = [x.abs() + 0.5 if positive else x for x in xs]
    return [x.to(dtype) for x in xs]


def same(fn, *lists, rtol=None, atol=None):
    """fn on CPU lists and on their neuron copies (out-of-place; in-place compares the inputs)."""
    cpu = [[x.clone() for x in xs] if isinstance(xs, list) else xs for xs in lists]
    dev = [to_neuron(xs) for xs in cpu]
    expected, actual = fn(*cpu), fn(*dev)
    assert_same(expected, actual, rtol, atol)
    assert_same(cpu, dev, rtol, atol)


BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "clamp_min", "clamp_max", "pow"]


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("inplace", [False, True])
def test_binary(name, inplace):
    op = getattr(torch, f"_foreach_{name}{'_' if inplace else ''}")
    positive = name == "pow"
    same(lambda a, b: op(a, b), tensors(positive=positive), tensors())
    same(lambda a: op(a, 1.5), tensors(positive=positive))
    same(lambda a: op(a, [0.5, 2, -1.0, 3]), tensors(positive=positive))
    if name in ("add", "mul", "div"):
        same(lambda a, t: op(a, t), tensors(), torch.tensor(2.5))
    if name in ("add", "sub"):
        same(lambda a, b: op(a, b, alpha=0.25), tensors(), tensors())


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.bfloat16])
def test_binary_dtypes(dtype):
    same(lambda a: torch._foreach_mul(a, 0.5), tensors(dtype))
    same(lambda a: torch._foreach_add(a, 2), tensors(dtype))
    same(lambda a, b: torch._foreach_div(a, b), tensors(dtype), tensors(dtype, positive=True))
    same(lambda a, b: torch._foreach_add(a, b), tensors(dtype), tensors(torch.float32))


def test_scalar_pow():
    same(lambda a: torch._foreach_pow(2.0, a), tensors())


@pytest.mark.parametrize("name", ["addcmul", "addcdiv"])
@pytest.mark.parametrize("inplace", [False, True])
def test_addc(name, inplace):
    op = getattr(torch, f"_foreach_{name}{'_' if inplace else ''}")
    b, c = tensors(), tensors(positive=True)
    same(lambda a, b, c: op(a, b, c), tensors(), b, c)
    same(lambda a, b, c: op(a, b, c, 0.3), tensors(), b, c)
    same(lambda a, b, c: op(a, b, c, [0.3, 1, -2.0, 4]), tensors(), b, c)


@pytest.mark.parametrize("inplace", [False, True])
def test_lerp(inplace):
    op = torch._foreach_lerp_ if inplace else torch._foreach_lerp
    same(lambda a, b: op(a, b, 0.3), tensors(), tensors())
    same(lambda a, b: op(a, b, 0.9), tensors(), tensors())
    same(lambda a, b, w: op(a, b, w), tensors(), tensors(), tensors())


@pytest.mark.parametrize("name", ["sqrt", "neg", "reciprocal", "sign", "abs", "exp", "zero"])
@pytest.mark.parametrize("inplace", [False, True])
def test_unary(name, inplace):
    if name == "zero" and not inplace:
        return  # only _foreach_zero_ is public
    op = getattr(torch, f"_foreach_{name}{'_' if inplace else ''}")
    same(lambda a: op(a), tensors(positive=name == "sqrt"))


def test_unary_int_to_float():
    same(lambda a: torch._foreach_sqrt(a), [torch.arange(4), torch.arange(3)])
    same(lambda a: torch._foreach_abs(a), [torch.arange(-2, 2), torch.arange(3)])


def test_copy_and_norm():
    same(lambda a, b: torch._foreach_copy_(a, b), tensors(), tensors())
    same(lambda a, b: torch._foreach_copy_(a, b), tensors(), tensors(torch.float64))
    for ord in (1, 2, float("inf")):
        same(lambda a, ord=ord: torch._foreach_norm(a, ord), tensors(), rtol=1e-6, atol=1e-6)
    same(lambda a: torch._foreach_norm(a), tensors(torch.bfloat16), rtol=1e-2, atol=1e-2)
    same(lambda a: torch._foreach_norm(a, 2, dtype=torch.float64), tensors())


OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    "sgd_nesterov_wd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                                                 foreach=True),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01, foreach=True),
    "adam_amsgrad_wd": lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True, weight_decay=0.1, foreach=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, foreach=True),
}


def _train(make, device):
    """Five optimizer steps on a small Linear, with gradients that depend on the parameters
    (set directly, so that only the optimizer's ops run on the device)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(device)
    opt = make(model.parameters())
    for step in range(5):
        for p in model.parameters():
            p.grad = p.detach() * 0.5 + 0.01 * (step + 1)
        opt.step()
        opt.zero_grad()
    return [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_matches_cpu(name):
    expected = _train(OPTIMIZERS[name], "cpu")
    actual = _train(OPTIMIZERS[name], "neuron")
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["_foreach_addcmul", "_foreach_addcdiv"])
def test_tensor_of_scalars_overloads(name):
    """Adam-style calls pass the per-list values as a 1-D CPU tensor."""
    xs, t1, t2 = tensors(), tensors(), tensors(positive=True)
    scalars = torch.linspace(-1.5, 2.0, len(xs))
    same(lambda a, b, c: getattr(torch, name)(a, b, c, scalars), xs, t1, t2)
    same(lambda a, b, c: getattr(torch, name + "_")(a, b, c, scalars), xs, t1, t2)


def _long_list(device: str) -> list:
    """Twelve tensors of every layout a list described in bulk meets, made on `device` from the
    same values: contiguous, transposed, at an offset, strided, two views of one storage, a 0-dim
    tensor, and the same tensor twice."""
    g = torch.Generator().manual_seed(0)

    def made(*shape):
        return torch.randn(*shape, generator=g).to(device)

    shared = made(16)[:12].reshape(3, 4)
    xs = [made(3, 4), made(4, 3).t(), made(10)[3:8], shared[0], shared[1:], made(()), made(2, 3, 2)[:, 1], made(6)]
    return xs + [xs[0], made(5), made(7)[::2], made(3, 4)]


def test_long_lists_in_place_write_through_every_view_as_on_cpu():
    a_cpu, a = _long_list("cpu"), _long_list("neuron")
    b_cpu = [torch.randn(x.shape, generator=torch.Generator().manual_seed(i)) for i, x in enumerate(a_cpu)]
    b = [x.to("neuron") for x in b_cpu]
    for op in (lambda a, b: torch._foreach_addcmul_(a, b, b, 0.5), lambda a, b: torch._foreach_mul_(a, 0.9),
               lambda a, b: torch._foreach_lerp_(a, b, 0.25)):
        op(a_cpu, b_cpu)
        op(a, b)
    for x, y in zip(a, a_cpu):
        assert x.stride() == y.stride() and x.storage_offset() == y.storage_offset()
        torch.testing.assert_close(x.cpu(), y)
    out = torch._foreach_sqrt(torch._foreach_abs(a))
    torch.testing.assert_close([o.cpu() for o in out], torch._foreach_sqrt(torch._foreach_abs(a_cpu)))


@pytest.mark.parametrize("length", [3, 10])
def test_an_update_reading_another_index_of_the_list_it_writes_runs_in_order_as_on_cpu(length):
    cpu = [torch.randn(4, generator=torch.Generator().manual_seed(i)) for i in range(length)]
    dev = [x.to("neuron") for x in cpu]
    for xs in (cpu, dev):
        torch._foreach_add_(xs, xs[::-1])  # (the second half adds the first half's new values)
        torch._foreach_mul_(xs, [2.0] * length)
        torch._foreach_addcmul_(xs, xs[1:] + xs[:1], xs, 0.5)
    torch.testing.assert_close([x.cpu() for x in dev], cpu)
    with pytest.raises(RuntimeError, match="same number of tensors"):  # (PyTorch's error, not ours)
        torch._foreach_add_(dev, dev[::-1][:-1])


def test_long_lists_of_storages_never_written_read_zeros():
    xs = [torch.zeros(3, device="neuron").new_empty(3).zero_() for _ in range(9)]
    empties = [torch.empty(3, device="neuron") for _ in range(9)]
    torch._foreach_add_(xs, 1.0)
    torch._foreach_mul_(empties, 0.0)  # (a storage without a value reads as zeros here: * 0 keeps them finite)
    assert all(x.cpu().tolist() == [1.0] * 3 for x in xs)
    assert all(e.cpu().abs().sum().item() == 0 for e in empties)


def test_a_long_list_with_a_cpu_tensor_raises_cudas_error():
    xs = [torch.randn(3).to("neuron") for _ in range(9)] + [torch.randn(3)]
    with pytest.raises(RuntimeError, match="same device"):
        torch._foreach_add_(xs, [torch.randn(3).to("neuron") for _ in range(10)])


def test_long_lists_of_conjugate_views_compute_their_values():
    zs = [torch.randn(4, dtype=torch.complex64) for _ in range(9)]
    cpu = [z.conj() for z in zs]
    dev = [z.to("neuron").conj() for z in zs]
    torch.testing.assert_close([x.cpu() for x in torch._foreach_mul(dev, 2.0)], torch._foreach_mul(cpu, 2.0))
