import re
import warnings

import pytest
import torch

from tests.reference import check

pytestmark = pytest.mark.usefixtures("no_fallback")


DTYPES = [torch.float32, torch.float64, torch.int64, torch.bool, torch.bfloat16]


def make(shape, dtype=torch.float32):
    x = torch.randn(shape) * 5
    return x > 0 if dtype is torch.bool else x.to(dtype)


def idx(*values):
    return torch.tensor(values)


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_advanced(dtype):
    x = make((4, 5, 3), dtype)
    i = idx(0, -1, 2)
    check(lambda t, i: t[i], x, i)
    check(lambda t, i: t[:, i], x, i)
    check(lambda t, i: t[i, i], x, i)
    check(lambda t, i: t[i, :, idx(0, 1, -1).to(t.device)], x, i)
    check(lambda t, i: t[None, ..., i.view(3, 1)], x, i)
    check(lambda t, i: t[i.view(3, 1), idx(1, 2).to(t.device)], x, i)


def test_index_noncontiguous_and_0d():
    x = make((6, 5))
    check(lambda t, i: t.t()[i], x, idx(1, -2))
    check(lambda t, i: t[::2][:, i], x, idx(4, 0))
    check(lambda t, i: t[i], x, torch.tensor(-1))
    check(lambda t, i: t[i], x, torch.tensor([], dtype=torch.int64))


def test_index_bool_mask():
    x = make((4, 5))
    check(lambda t, m: t[m], x, x > 0)
    check(lambda t, m: t[m[:, 0]], x, x > 0)
    check(lambda t, m: t[:, m[0]], x, x > 0)
    check(lambda t, m: t[m[:, 0], 1], x, x > 0)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_index_put(accumulate, dtype):
    x = make((5, 4), dtype)
    i = idx(0, -1, 2) if not accumulate else idx(0, -1, 0, 4)
    v = make((len(i), 4), dtype)
    check(lambda t, i, v: t.clone().index_put_((i,), v, accumulate=accumulate), x, i, v)
    cols = idx(3, -1, 0, 3)[:len(i)]
    check(lambda t, i, v: torch.ops.aten.index_put(t, [None, i], v, accumulate), x, cols, make((5, len(i)), dtype))
    check(lambda t, i, j, v: t.clone().index_put_((i, j), v[:, 0], accumulate=accumulate), x, i, cols, v)
    check(lambda t, i, v: t.clone().index_put_((i,), v[0, :1], accumulate=accumulate), x, i, v)


def test_setitem_forms():
    x = make((5, 4))

    def set_scalar(t, m):
        y = t.clone()
        y[m] = 0.5
        return y

    def set_values(t, m):
        y = t.clone()
        y[m] = t[m] * 2
        return y

    def set_rows(t, m):
        y = t.clone()
        y[m[:, 0]] = -1.0
        y[idx(1, -1).to(t.device), 2] = 7.0
        return y

    def set_transposed(t, i):
        y = t.clone().t()
        y[:, i] = 3.0
        return y

    check(set_scalar, x, x > 0)
    check(set_values, x, x > 0)
    check(set_rows, x, x > 0)
    check(set_transposed, x, idx(0, -2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_select_gather(dtype):
    x = make((4, 5), dtype)
    check(lambda t, i: torch.index_select(t, 1, i), x, idx(4, 0, 0))
    check(lambda t, i: torch.index_select(t, -2, i), x, idx(3, 1))
    check(lambda t, i: torch.index_select(t, 0, i), make((), dtype), torch.tensor([0]))
    check(lambda t, i: torch.gather(t, 1, i), x, idx([0, 1], [4, 4], [2, 0], [1, 3]))
    check(lambda t, i: torch.gather(t, 0, i), x, idx([0, 3, 1]))
    check(lambda t, i: torch.gather(t.t(), 0, i), x, idx([0, 3], [1, 2]))
    # an empty index may have another rank than the input
    check(lambda t, i: torch.gather(t, 0, i), make((5,), dtype), torch.empty((0, 0), dtype=torch.long))


def test_gradients():
    x = make((5, 4))
    check(lambda t, i: t[i], x, idx(0, -1, 0, 2), grad=True)
    check(lambda t, i: t[:, i] * 2, x, idx(3, 3), grad=True)
    check(lambda t, i: torch.index_select(t, 0, i), x, idx(1, 1, 4), grad=True)
    check(lambda t, i: torch.gather(t, 1, i), x, idx([0, 0], [1, 3], [2, 2], [3, 1], [0, 1]), grad=True)
    check(lambda t, i: torch.nn.functional.embedding(i, t), x, idx([0, 1], [4, 4]), grad=True)
    check(lambda t, i: torch.nn.functional.embedding(i, t, padding_idx=1, scale_grad_by_freq=True), x,
          idx([0, 1], [4, 4]), grad=True)


SCATTER_INDEX = idx([0, 1], [2, 2], [4, 0], [1, 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_scatter(dtype):
    x, src = make((4, 5), dtype), make((4, 3), dtype)
    check(lambda t, i, s: t.scatter(1, i, s), x, idx([0, 1], [2, 3], [4, 0], [1, 2]), src)
    check(lambda t, i: t.scatter(1, i, 2), x, SCATTER_INDEX)
    check(lambda t, i, s: t.scatter(1, i, s, reduce="add"), x, SCATTER_INDEX, src)
    check(lambda t, i, s: t.scatter(1, i, s, reduce="multiply"), x, SCATTER_INDEX, src)
    check(lambda t, i: t.scatter(1, i, 3, reduce="add"), x, SCATTER_INDEX)
    check(lambda t, i, s: t.scatter_add(1, i, s), x, SCATTER_INDEX, src)
    check(lambda t, i, s: t.clone().scatter_add_(0, i, s), x, idx([0, 1, 2], [0, 0, 3]), src)
    check(lambda t, i, s: t.t().scatter_add(0, i.t(), s.t()), x, SCATTER_INDEX, src)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_reduce(reduce, include_self, dtype):
    x, src = make((4, 5), dtype), make((4, 3), dtype)
    check(lambda t, i, s: t.scatter_reduce(1, i, s, reduce, include_self=include_self), x, SCATTER_INDEX, src)
    check(lambda t, i, s: t.clone().scatter_reduce_(0, i, s, reduce, include_self=include_self), x,
          idx([0, 0, 3], [0, 2, 3]), src)


def test_index_add_copy_fill():
    x = make((5, 4))
    check(lambda t, i, s: t.index_add(0, i, s, alpha=2), x, idx(0, 4, 0), make((3, 4)))
    check(lambda t, i, s: t.clone().index_add_(1, i, s), x, idx(3, 1), make((5, 2)))
    check(lambda t, i, s: t.index_add(0, i, s), make((5,), torch.int64), idx(1, 1), idx(2, 3))
    check(lambda t, i, s: t.index_copy(0, i, s), x, idx(0, 4, 2), make((3, 4)))
    check(lambda t, i, s: t.clone().index_copy_(1, i, s), x, idx(3, 1), make((5, 2)))
    check(lambda t, i: t.index_fill(1, i, -1.5), x, idx(0, -1))
    check(lambda t, i: t.clone().index_fill_(0, i, torch.tensor(2.0, device=t.device)), x, idx(2,))
    check(lambda t, i: t.index_fill(0, i, 3), make((), torch.int64), torch.tensor([0]))


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin"])
def test_bool_accumulating_scatters(reduce):
    # bool sums and products are or and and (XLA scatters have no bool add or multiply)
    x, i, src = make((5,), torch.bool), idx(1, 1, 3, 0), torch.tensor([True, True, False, False])
    check(lambda x, i, s: x.index_add(0, i, s), x, i, src)
    check(lambda x, i, s: x.put(i, s, accumulate=True), x, i, src)
    check(lambda x, i, s: x.index_put((i,), s, accumulate=True), x, i, src)
    check(lambda x, i, s: x.scatter_add(0, i, s), x, i, src)
    check(lambda x, i, s: x.scatter(0, i, s, reduce="multiply"), ~x, i, src)
    for include_self in (True, False):
        check(lambda x, i, s, inc=include_self: x.scatter_reduce(0, i, s, reduce, include_self=inc), x, i, src)


def test_masked_scatter_take_put():
    x = make((4, 5))
    check(lambda t, m, s: t.masked_scatter(m, s), x, x > 0, make((30,)))
    check(lambda t, m, s: t.clone().masked_scatter_(m, s), x, (x > 0)[0], make((30,)))
    check(lambda t, i: torch.take(t, i), x, idx([0, -1], [19, 7]))
    check(lambda t, i: torch.take(t.t(), i), x, idx(3, -4))
    check(lambda t, i, s: t.clone().put_(i, s), x, idx(0, -1, 5), make((3,)))
    check(lambda t, i, s: t.clone().put_(i, s, accumulate=True), x, idx(0, 0, -1), make((3,)))
    check(lambda t, i, s: t.put(i, s), x, idx([1, 2]), make((2,)))


def test_masked_scatter_backward():
    # source's gradient: the masked positions' gradients in order, zeros for source's unused tail
    x = make((4, 5))
    check(lambda t, m, s: t.masked_scatter(m, s), x, x > 0, make((30,)), grad=True)
    check(lambda t, m, s: t.masked_scatter(m, s), x, (x > 0)[0], make((6, 5)), grad=True)
    check(lambda t, m, s: t.masked_scatter(m, s), x, x > 9, make((3,)), grad=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nonzero_masked_select(dtype):
    x = make((4, 5), dtype)
    check(torch.nonzero, x)
    check(lambda t: torch.nonzero(t.t()[::2]), x)
    check(torch.nonzero, make((), dtype))
    check(torch.nonzero, torch.zeros(3, 0, dtype=dtype))
    check(lambda t, m: torch.masked_select(t, m), x, make((4, 5), torch.bool))
    check(lambda t, m: torch.masked_select(t, m), x, make((5,), torch.bool))
    check(lambda t: torch.argwhere(t), x)


def test_data_dependent_out_variants_resize_and_fill():
    a = torch.randn(7, 7)
    mask = a > 0
    for fn in (lambda x, m, out: torch.masked_select(x, m, out=out),):
        out = torch.empty(0, device="neuron")
        result = fn(a.to("neuron"), mask.to("neuron"), out)
        assert result is out
        torch.testing.assert_close(out.cpu(), torch.masked_select(a, mask))
    out = torch.empty(0, dtype=torch.long, device="neuron")
    torch.nonzero(mask.to("neuron"), out=out)
    torch.testing.assert_close(out.cpu(), torch.nonzero(mask))


def test_equal_and_narrow_copy():
    a = torch.randn(4, 5)
    d = a.to("neuron")
    assert torch.equal(d, d.clone()) and not torch.equal(d, d + 1) and not torch.equal(d, d[:2])
    check(lambda t: t.narrow_copy(1, -3, 2), a)


@pytest.mark.parametrize("fn", [
    lambda t: torch._unique2(t),
    lambda t: torch.unique(t, return_inverse=True, return_counts=True),
    lambda t: torch.unique(t.float(), sorted=False, return_inverse=True),
    lambda t: torch.unique_consecutive(t, return_inverse=True, return_counts=True),
    lambda t: torch.unique_consecutive(t.flatten()),
])
def test_unique_family(fn):
    check(fn, torch.tensor([[3, 1, 2, 2], [1, 3, 3, 0]]))


@pytest.mark.parametrize("dim", [0, 1, -1, 2])
@pytest.mark.parametrize("flags", [(False, False), (True, False), (False, True), (True, True)])
def test_unique_consecutive_along_a_dim(dim, flags):
    x = torch.tensor([[[1, 2], [1, 2], [3, 4]], [[1, 2], [1, 2], [1, 2]], [[1, 2], [1, 2], [3, 4]]])
    x = torch.cat([x, x[:1], x], dim=0)
    inverse, counts = flags
    check(lambda t: torch.unique_consecutive(t, return_inverse=inverse, return_counts=counts, dim=dim), x)
    check(lambda t: torch.ops.aten.unique_consecutive(t, inverse, counts, dim), x.float())


@pytest.mark.parametrize("make, dim", [
    (lambda: torch.tensor([1.0, 1.0, float("nan"), float("nan"), 2.0]), 0),  # 1-D: as without dim
    (lambda: torch.tensor([[float("nan")], [float("nan")]]), 0),              # NaN slices differ
    (lambda: torch.tensor([[True, False], [True, False]]), 0),
    (lambda: torch.empty(0, 3), 0),
    (lambda: torch.empty(2, 0, 3), 1),
])
def test_unique_consecutive_along_a_dim_edges(make, dim):
    check(lambda t: torch.ops.aten.unique_consecutive(t, True, True, dim), make())


@pytest.mark.parametrize("make, dim", [
    (lambda: torch.tensor(5), 0),
    (lambda: torch.ones(2, 3), 2),
    (lambda: torch.ones(2, 0, 3), 0),
    (lambda: torch.ones(0, 0, 3), 0),
])
def test_unique_consecutive_along_a_dim_errors(make, dim):
    x = make()
    with pytest.raises(Exception) as cpu:
        torch.unique_consecutive(x, dim=dim)
    with pytest.raises(type(cpu.value), match=re.escape(str(cpu.value))):
        torch.unique_consecutive(x.to("neuron"), dim=dim)


def test_nonzero_static_pads_and_cuts():
    x = torch.tensor([[0, 1], [2, 0], [3, 3]])
    for size, fill in [(6, -1), (2, 7), (0, -1)]:
        check(lambda t, size=size, fill=fill: torch.nonzero_static(t, size=size, fill_value=fill), x)


@pytest.mark.parametrize("repeats", [[2, 0, 3], [1], [], [0, 0]])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_repeat_interleave_of_repeats_runs_on_neuron(repeats, dtype):
    # the index form (its size from the values): x.repeat_interleave(tensor) and vision-language
    # models' image-token spans take it
    check(lambda r: torch.repeat_interleave(r), torch.tensor(repeats, dtype=dtype))
    x = torch.arange(len(repeats) * 2.0).reshape(len(repeats), 2)
    check(lambda t, r: t.repeat_interleave(r, dim=0), x, torch.tensor(repeats, dtype=dtype))
    check(lambda r: torch.ops.aten.repeat_interleave.Tensor(r, output_size=sum(repeats)),
          torch.tensor(repeats, dtype=dtype))


@pytest.mark.parametrize("repeats, kwargs", [
    (torch.tensor([[1, 2]]), {}), (torch.tensor([1, -2]), {}), (torch.tensor([1.0, 2.0]), {}),
    (torch.tensor([1, 2]), {"output_size": 5}),
])
def test_repeat_interleave_of_repeats_errors_as_cpu(repeats, kwargs):
    with pytest.raises(Exception) as cpu:
        torch.ops.aten.repeat_interleave.Tensor(repeats, **kwargs)
    with pytest.raises(type(cpu.value), match=re.escape(str(cpu.value))):
        torch.ops.aten.repeat_interleave.Tensor(repeats.to("neuron"), **kwargs)


def test_byte_masks_index_as_bool_masks_with_cpus_warning():
    v = torch.randn(5, 7, 3)
    mask = torch.tensor([1, 0, 1, 1, 0], dtype=torch.uint8)
    columns = torch.tensor([1, 1, 0, 1, 0, 0, 1], dtype=torch.uint8)
    for device_mask in (True, False):  # a CPU mask is moved to the device first, as on CUDA
        m = mask.to("neuron") if device_mask else mask
        with pytest.warns(UserWarning, match="indexing with dtype torch.uint8 is now deprecated"):
            torch.testing.assert_close(v.to("neuron")[m].cpu(), v[mask.bool()])
    check(lambda t, m: t[:, m], v, columns)
    with warnings.catch_warnings(record=True) as caught:  # each byte mask warns, at each call, as on CPU
        warnings.simplefilter("always")
        check(lambda t, a, b: t[a, :, b[:3]], v, mask, torch.ones(3, dtype=torch.uint8))
    assert len(caught) == 4
    check(lambda t, m: t[m], v, (torch.randn(5, 7) > 0).to(torch.uint8))

    def accumulate(y, m):
        return y.index_put_((m,), y[m], accumulate=True)
    check(accumulate, torch.ones(10, 10), torch.zeros(10, dtype=torch.uint8))
    check(accumulate, torch.ones(10, 10), torch.tensor([1, 0] * 5, dtype=torch.uint8))


def _outcome(fn, device):
    try:
        result = fn(device)
        return None, result.cpu() if isinstance(result, torch.Tensor) else result
    except Exception as e:  # noqa: BLE001 (the type is what is compared)
        return type(e), str(e).split("\n")[0]


def _setitem(x, key, value):
    x[key] = value
    return x


INDEX_ERRORS = {
    "int8 index": lambda d: torch.arange(3.0, device=d)[torch.tensor([1, 2], dtype=torch.int8, device=d)],
    "float index": lambda d: torch.zeros(3, device=d)[torch.tensor([0.0], device=d)],
    "empty float index of two dims": lambda d: torch.zeros(2, 3, device=d)[torch.empty(0, 2, device=d)],
    "float index accumulated": lambda d: torch.zeros(5, device=d).index_put_(
        (torch.tensor([], device=d),), torch.tensor(1.0, device=d), accumulate=True),
    "mask of another shape": lambda d: torch.arange(6.0, device=d).view(2, 3)[torch.tensor([True, False, True], device=d)],
    "byte mask of another shape": lambda d: torch.arange(6.0, device=d).view(2, 3)[
        torch.tensor([1, 0, 1], dtype=torch.uint8, device=d)],
    "mask of another shape set": lambda d: torch.zeros(2, 3, device=d).index_put_(
        (torch.tensor([True, False, True], device=d),), torch.tensor(1.0, device=d)),
    "indices not broadcasting": lambda d: torch.zeros(3, 3, device=d)[torch.tensor([0, 1], device=d),
                                                                      torch.tensor([0, 1, 2], device=d)],
    "mask and index not broadcasting": lambda d: torch.zeros(3, 3, device=d)[torch.tensor([True, False, True], device=d),
                                                                             torch.tensor([0, 1, 2], device=d)],
    "put indices not broadcasting": lambda d: torch.zeros(3, 3, device=d).index_put_(
        (torch.tensor([[0, 1]], device=d), torch.tensor([0, 1, 2], device=d)), torch.tensor(1.0, device=d), accumulate=True),
    "values of another shape": lambda d: torch.zeros(5, device=d).index_put_(
        (torch.tensor([0, 1], device=d),), torch.ones(3, device=d)),
    "setitem values not expanding": lambda d: torch.zeros(3, 4, device=d).__setitem__(
        (slice(None), torch.tensor([0, 1], device=d)), torch.ones(3, 3, device=d)),
    "setitem rows not expanding": lambda d: torch.zeros(2, 3, device=d).__setitem__(
        torch.tensor([0, 1], device=d), torch.ones(2, 2, device=d)),
    "empty index accumulated": lambda d: torch.zeros(5, 3, device=d).index_put_(
        (torch.tensor([], dtype=torch.long, device=d),), torch.tensor([1.0, 2, 3], device=d), accumulate=True),
    "empty index of two dims": lambda d: torch.zeros(2, 3, device=d)[torch.empty(0, 2, dtype=torch.long, device=d)],
    "values expanding": lambda d: torch.zeros(3, 4, device=d).index_put_(
        (torch.tensor([0, 2], device=d),), torch.ones(4, device=d)),
    "index_put of doubles into floats": lambda d: torch.zeros(3, device=d).index_put_(
        (torch.tensor([0], device=d),), torch.tensor([1.0], dtype=torch.double, device=d)),
    "index_put accumulating longs into floats": lambda d: torch.zeros(3, device=d).index_put(
        (torch.tensor([0], device=d),), torch.tensor([1], device=d), accumulate=True),
    "index_put of a 0-d double": lambda d: torch.zeros(3, device=d).index_put_(
        (torch.tensor([0], device=d),), torch.tensor(1.0, dtype=torch.double, device=d)),
    "one double into a mask": lambda d: torch.zeros(3, device=d).index_put_(
        (torch.tensor([True, False, True], device=d),), torch.tensor(2.0, dtype=torch.double, device=d)),
    "doubles into a mask": lambda d: torch.zeros(3, device=d).index_put_(
        (torch.tensor([True, False, True], device=d),), torch.tensor([1.0, 2], dtype=torch.double, device=d)),
    "setitem of an int": lambda d: _setitem(torch.zeros(3, device=d), torch.tensor([0, 2], device=d), 5),
    "masked_fill with a byte mask": lambda d: torch.zeros(3, device=d).masked_fill(
        torch.tensor([1, 0, 1], dtype=torch.uint8, device=d), 5.0),
    "masked_fill_ with an int8 mask": lambda d: torch.zeros(3, device=d).masked_fill_(
        torch.tensor([1, 0, 1], dtype=torch.int8, device=d), 5.0),
}


@pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8")
@pytest.mark.parametrize("name", INDEX_ERRORS)
def test_indexing_errors_are_cpus(name):
    # the same exception type as CPU (IndexError, not a lowering's TypeError or ValueError) and CPU's message
    (cpu_error, cpu), (neuron_error, neuron) = (_outcome(INDEX_ERRORS[name], d) for d in ("cpu", "neuron"))
    assert neuron_error == cpu_error, (cpu, neuron)
    if cpu_error is None:
        torch.testing.assert_close(neuron, cpu)
    else:
        assert neuron.endswith(cpu), (cpu, neuron)


def test_mask_selecting_fewer_elements_than_values_is_a_device_assert():
    x = torch.zeros(4, device="neuron")
    x[torch.tensor([True, False, True, False], device="neuron")] = torch.ones(3, device="neuron")
    with pytest.raises(RuntimeError, match="shape mismatch: value tensor of shape \\[3\\] cannot be broadcast"):
        x.cpu()
