import pytest
import torch

from tests.reference import check

pytestmark = pytest.mark.usefixtures("lowered_only")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bin_counts(dtype):
    x = torch.randn(40, 3, dtype=dtype)
    w = torch.rand(40, dtype=dtype)
    check(lambda x: torch.histogramdd(x, bins=[3, 4, 5]), x)
    check(lambda x: torch.histogramdd(x, bins=4), x)
    check(lambda x, w: torch.histogramdd(x, bins=[3, 4, 5], weight=w, density=True), x, w)
    check(lambda x: torch.histogramdd(x, bins=[3, 4, 5], range=[-1.0, 1.0, 0.0, 2.0, -3.0, 0.0]), x)
    check(lambda x: torch.histogramdd(x.reshape(4, 10, 3), bins=[2, 2, 2], density=True), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_points_on_edges_and_degenerate_ranges(dtype):
    # points on the computed edges land where CPU's linear guess and local search put them
    grid = torch.stack([torch.arange(0, 31, dtype=dtype) / 10, torch.arange(30, -1, -1, dtype=dtype) / 7], 1)
    check(lambda x: torch.histogramdd(x, bins=[3, 7]), grid)
    check(lambda x: torch.histogramdd(x, bins=[10, 13], range=[0.0, 3.0, 0.0, 30 / 7]), grid)
    check(lambda x: torch.histogramdd(torch.ones_like(x), bins=[2, 2]), grid)  # widened by 0.5
    check(lambda x: torch.histogramdd(x[:0], bins=[2, 3]), grid)  # no points: [0, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bin_tensors(dtype):
    x = torch.randn(40, 3, dtype=dtype)
    w = torch.rand(40, dtype=dtype)
    bins = [torch.tensor([-2.0, -0.5, 0.0, 3.0], dtype=dtype), torch.tensor([-1.0, 1.0], dtype=dtype),
            torch.tensor([-3.0, 0.0, 0.1, 0.2, 4.0], dtype=dtype)]
    check(lambda x, *b: torch.histogramdd(x, bins=list(b)), x, *bins)
    check(lambda x, w, *b: torch.histogramdd(x, bins=list(b), weight=w, density=True), x, w, *bins)
    check(lambda x, *b: torch.histogramdd(x, bins=list(b)), torch.tensor([[0.0, 1.0, 0.1]], dtype=dtype), *bins)
