import pytest
import torch

from tests.reference import assert_same, check

D = "neuron"


pytestmark = pytest.mark.usefixtures("no_fallback")


def same_factory(fn):
    """fn(device) on CPU and on neuron give equal tensors."""
    assert_same(fn("cpu"), fn(D))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool, torch.bfloat16])
def test_zeros_ones_full(dtype):
    same_factory(lambda d: torch.zeros(3, 2, dtype=dtype, device=d))
    same_factory(lambda d: torch.ones(4, dtype=dtype, device=d))
    same_factory(lambda d: torch.full((2, 3), 1 if dtype is torch.bool else 7, dtype=dtype, device=d))
    same_factory(lambda d: torch.zeros((), dtype=dtype, device=d))
    same_factory(lambda d: torch.ones(0, 3, dtype=dtype, device=d))


def test_full_infers_dtype():
    same_factory(lambda d: torch.full((2,), 2.5, device=d))
    same_factory(lambda d: torch.full((2,), 3, device=d))
    same_factory(lambda d: torch.full((2,), True, device=d))


def test_like_and_new():
    x = torch.randn(3, 4)
    check(torch.zeros_like, x)
    check(torch.ones_like, x)
    check(lambda t: torch.full_like(t, 3.5), x)
    check(lambda t: t.new_full((2,), 4), x)
    check(lambda t: t.new_zeros((2, 2), dtype=torch.int64), x)
    check(lambda t: torch.empty_like(t).shape, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_fill_and_zero_inplace(dtype):
    x = torch.ones(3, 4, dtype=dtype)
    check(lambda t: t.clone().fill_(2), x)
    check(lambda t: t.clone().zero_(), x)
    check(lambda t: t.clone().fill_(torch.tensor(3, device=t.device)), x)
    check(lambda t: t.clone().fill_(torch.tensor(5)), x)  # a 0-d CPU tensor value


def test_fill_noncontiguous():
    check(lambda t: t.clone().t().fill_(1.5), torch.randn(3, 4))
    check(_fill_slice, torch.randn(3, 4))


def _fill_slice(t):
    y = t.clone()
    y[:, ::2].fill_(9)
    return y


@pytest.mark.parametrize("args,kwargs", [
    ((5,), {}), ((1, 5), {}), ((1, 5, 0.5), {}), ((0, 1, 0.1), {}), ((5, 1, -1), {}),
    ((5,), {"dtype": torch.float32}), ((0.5, 3.2), {}), ((10,), {"dtype": torch.bfloat16}),
    ((2, 2), {}), ((-3, 7, 3), {"dtype": torch.int32}),
])
def test_arange(args, kwargs):
    same_factory(lambda d: torch.arange(*args, device=d, **kwargs))


@pytest.mark.parametrize("start,end,steps", [(0, 1, 5), (-2, 3.5, 7), (3, 3, 1), (0, 1, 0), (1, -1, 4)])
@pytest.mark.parametrize("dtype", [None, torch.float64, torch.int64])
def test_linspace_logspace(start, end, steps, dtype):
    same_factory(lambda d: torch.linspace(start, end, steps, dtype=dtype, device=d))
    assert_same(torch.logspace(start, end, steps, dtype=dtype),
                torch.logspace(start, end, steps, dtype=dtype, device=D), rtol=1e-6, atol=1e-6)
    assert_same(torch.logspace(start, end, steps, base=2, dtype=dtype),
                torch.logspace(start, end, steps, base=2, dtype=dtype, device=D), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n,m", [(3, None), (2, 4), (4, 2), (0, 3)])
@pytest.mark.parametrize("dtype", [None, torch.int64, torch.bool])
def test_eye(n, m, dtype):
    if m is None:
        same_factory(lambda d: torch.eye(n, dtype=dtype, device=d))
    else:
        same_factory(lambda d: torch.eye(n, m, dtype=dtype, device=d))


def test_scalar_tensor():
    same_factory(lambda d: torch.scalar_tensor(3, device=d))
    same_factory(lambda d: torch.scalar_tensor(2.5, dtype=torch.float64, device=d))


def test_device_index():
    assert torch.zeros(2, device="neuron:1").device == torch.device("neuron", 1)
    assert torch.arange(3, device="neuron:1").device == torch.device("neuron", 1)


@pytest.mark.usefixtures("lowered_only")
@pytest.mark.parametrize("shape", [(3, 4, 1), (3, 4, -1), (4, 3, 0), (0, 3, 0), (3, 3, 5), (3, 3, -5)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_triu_tril_indices(shape, dtype):
    for fn in (torch.triu_indices, torch.tril_indices):
        assert_same(fn(*shape, dtype=dtype), fn(*shape, dtype=dtype, device="neuron"))
