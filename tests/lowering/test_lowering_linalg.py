import pytest
import torch

from tests.reference import check

pytestmark = pytest.mark.usefixtures("lowered_only")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mm_bmm_dot_mv(dtype):
    a, b = torch.randn(3, 5, dtype=dtype), torch.randn(5, 4, dtype=dtype)
    check(torch.mm, a, b, grad=True)
    check(torch.bmm, torch.randn(2, 3, 5, dtype=dtype), torch.randn(2, 5, 4, dtype=dtype), grad=True)
    check(torch.dot, torch.randn(5, dtype=dtype), torch.randn(5, dtype=dtype), grad=True)
    check(torch.mv, a, torch.randn(5, dtype=dtype), grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.complex64])
@pytest.mark.parametrize("sizes", [(8, 8, 8), (1, 64, 64), (16, 16, 17)])  # small products, then one past
def test_small_and_large_products_match_cpu(dtype, sizes):
    from torchneuron.lowering import linalg
    m, k, n = sizes
    assert (m * k * n <= linalg.SMALL_PRODUCT) == (sizes != (16, 16, 17))

    def make(*shape):
        if dtype.is_floating_point or dtype.is_complex:
            return torch.randn(*shape, dtype=dtype)
        return torch.randint(-9, 9, shape, dtype=dtype)

    check(torch.mm, make(m, k), make(k, n))
    check(torch.bmm, make(2, m // 2 or 1, k), make(2, k, n))


def test_noncontiguous_and_matmul():
    a = torch.randn(5, 3).t()
    b = torch.randn(10, 4)[::2]
    check(torch.mm, a, b, grad=True)
    check(torch.matmul, torch.randn(2, 3, 4, 5).transpose(-1, -2), torch.randn(4, 6), grad=True)
    check(torch.nn.functional.linear, torch.randn(4, 8), torch.randn(3, 8), torch.randn(3), grad=True)


def test_addmm_beta_alpha():
    s, a, b = torch.randn(3, 4), torch.randn(3, 5), torch.randn(5, 4)
    check(lambda s, a, b: torch.addmm(s, a, b, beta=0.5, alpha=2.0), s, a, b, grad=True)
    check(lambda s, a, b: torch.addmm(s, a, b), torch.randn(4), a, b, grad=True)
    # beta=0 ignores self, NaNs included
    check(lambda s, a, b: torch.addmm(s, a, b, beta=0), torch.full((3, 4), float("nan")), a, b)


def test_addmv_baddbmm_addbmm_addr():
    check(lambda s, m, v: torch.addmv(s, m, v, beta=2, alpha=0.5), torch.randn(3), torch.randn(3, 4),
          torch.randn(4), grad=True)
    b1, b2 = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    check(lambda s, x, y: torch.baddbmm(s, x, y, beta=0.5, alpha=-1), torch.randn(2, 3, 5), b1, b2, grad=True)
    check(lambda s, x, y: torch.addbmm(s, x, y, alpha=3), torch.randn(3, 5), b1, b2, grad=True)
    check(lambda s, x, y: torch.addr(s, x, y, beta=2), torch.randn(3, 4), torch.randn(3), torch.randn(4))


def test_integer_and_out_and_inplace():
    a, b = torch.randint(-5, 5, (3, 4)), torch.randint(-5, 5, (4, 2))
    check(torch.mm, a, b)
    check(lambda s, a, b: s.addmm_(a, b), torch.randn(3, 2), torch.randn(3, 4), torch.randn(4, 2))
    check(lambda a, b, o: torch.mm(a, b, out=o), torch.randn(3, 4), torch.randn(4, 2), torch.empty(0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_accumulates_in_float32(dtype):
    a, b = torch.randn(8, 64, dtype=dtype), torch.randn(64, 8, dtype=dtype)
    check(torch.mm, a, b, rtol=1e-2, atol=1e-2)
    check(torch.bmm, a[None], b[None], rtol=1e-2, atol=1e-2)
    check(lambda s, a, b: torch.addmm(s, a, b, alpha=0.5), torch.randn(8, 8, dtype=dtype), a, b,
          rtol=1e-2, atol=1e-2)


def test_empty():
    check(torch.mm, torch.randn(0, 3), torch.randn(3, 4))
    check(torch.mm, torch.randn(2, 0), torch.randn(0, 4))


def test_grouped_mm_float32_like_cpu():
    """CPU takes float32 grouped matmuls (MoE layers in transformers); PyTorch's meta kernel
    checks CUDA's bfloat16-only rule, which neuron does not inherit."""
    a, b = torch.randn(6, 8), torch.randn(3, 8, 8)
    offs = torch.tensor([2, 2, 6], dtype=torch.int32)
    check(lambda a, b, offs: torch._grouped_mm(a, b, offs=offs), a, b, offs, rtol=1e-5, atol=1e-5)
    check(lambda a, b: torch._grouped_mm(a, b), b, b, rtol=1e-5, atol=1e-5)
