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


def test_as_strided_of_a_view_reads_its_storage():
    """as_strided addresses the storage: of a transposed or offset view it reads the base's order
    (Longformer's sliding-window chunks), compiled as in eager."""
    x = torch.arange(12.0).reshape(3, 4)
    _both(lambda x: x.t().as_strided((4, 3), (1, 4)) * 2, x)
    _both(lambda x: x[1:].as_strided((2, 2), (1, 4), 5) + 1, x)
    _both(lambda x: x.t().contiguous().as_strided((3, 2), (1, 3)) * 1, x)
    _both(lambda x: (x * 1).transpose(0, 1).as_strided((2, 2, 2), (4, 1, 4)).sum(-1), x)


def test_a_complex_rotary_embedding_backward_compiles_whole():
    """Llama 4's rotary embedding multiplies by complex frequencies: its backward conjugates them
    (`aten._conj` in the graph). Equal to CPU, and no graph runs op by op."""
    def step(x, w, freqs):
        q = (x @ w).view(2, 8, 4, 16)
        rotated = torch.view_as_complex(q.float().reshape(2, 8, 4, 8, 2)) * freqs[None, :, None, :]
        q = torch.view_as_real(rotated).flatten(3)
        q = (q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6)).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q).sum()

    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 8, 64, generator=generator), torch.randn(64, 64, generator=generator)
    freqs = torch.polar(torch.ones(8, 8), torch.randn(8, 8, generator=generator))
    w.requires_grad_()
    step(x, w, freqs).backward()
    on_neuron = w.detach().to("neuron").requires_grad_()
    before = compile_stats().get("eager_graphs", 0)
    torch.compile(step, backend="neuron")(x.to("neuron"), on_neuron, freqs.to("neuron")).backward()
    assert compile_stats().get("eager_graphs", 0) == before
    torch.testing.assert_close(on_neuron.grad.cpu(), w.grad, rtol=1e-4, atol=1e-4)


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
