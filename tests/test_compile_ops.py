"""Ops compiled graphs reach (view scatters, sort, histograms, _grouped_mm), eager and compiled, vs CPU."""
import pytest
import torch
import torch._dynamo

from tests.reference import check
from torchneuron.compile import compile_stats

pytestmark = pytest.mark.usefixtures("fresh_dynamo", "no_fallback")



def _both(fn, *args, **kwargs):
    check(fn, *args, **kwargs)
    check(torch.compile(fn, backend="neuron"), *args, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_view_scatters(dtype):
    x = torch.arange(48).reshape(6, 8).to(dtype)
    _both(lambda x: torch.slice_scatter(x, x[1:5:2] * 2, 0, 1, 5, 2), x)
    _both(lambda x: torch.slice_scatter(x, x[:, -3:] + 1, 1, -3), x)
    _both(lambda x: torch.select_scatter(x, x[:, 2] * 3, 1, -1), x)
    _both(lambda x: torch.diagonal_scatter(x, x.diagonal(2) + 7, 2), x)
    _both(lambda x: torch.diagonal_scatter(x.t(), x.t().diagonal(-1) + 7, -1), x)
    _both(lambda x: torch.as_strided_scatter(x, x[:3, :2] - 5, (3, 2), (8, 3), 1), x)


def test_sort_and_histc():
    x = torch.tensor([3.0, 1.0, 2.0, 1.0, 5.0, -1.0, 2.5])
    _both(lambda x: torch.sort(x, descending=True), x)
    _both(lambda x: torch.histc(x, bins=4, min=0, max=3), x)
    _both(lambda x: torch.histc(x, bins=5), x)  # min == max: the data's range
    _both(lambda x: torch.histc(torch.zeros_like(x), bins=3), x)  # an empty range widens by one


def test_grouped_mm():
    torch.manual_seed(0)
    a, b = torch.randn(6, 8).bfloat16(), torch.randn(3, 8, 8).bfloat16()
    offs = torch.tensor([2, 2, 6], dtype=torch.int32)  # an empty group in the middle
    _both(lambda a, b, offs: torch._grouped_mm(a, b, offs=offs), a, b, offs, rtol=2e-2, atol=2e-2)
    _both(lambda a, b: torch._grouped_mm(a, b), b, b, rtol=2e-2, atol=2e-2)
    # the weight gradient's form: 2-D x 2-D, groups over the inner dimension
    _both(lambda a, offs: torch._grouped_mm(a.t(), a, offs=offs), a, offs, rtol=2e-2, atol=2e-2)


def test_masked_scatter_backward():
    # Gemma 3 places image features with masked_scatter: its backward must lower in compiled graphs
    x = torch.randn(4, 5)
    eager_graphs = compile_stats().get("eager_graphs", 0)
    _both(lambda t, m, s: t.masked_scatter(m, s), x, x > 0, torch.randn(6, 5), grad=True)
    _both(lambda t, m, s: t.masked_scatter(m, s), x, (x > 0)[1], torch.randn(30), grad=True)
    assert compile_stats().get("eager_graphs", 0) == eager_graphs


def test_unfold_negative_dimension():
    x = torch.randn(3, 10)
    _both(lambda t: t.unfold(-1, 3, 3) * 2, x)
