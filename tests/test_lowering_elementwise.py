import torch
from reference import check


def test_add_scalar_alpha_and_promotion():
    a = torch.randn(3, 4)
    check(lambda x: x + 2, a)
    check(lambda x, y: torch.add(x, y, alpha=0.5), a, torch.randn(4))
    check(lambda x: x + 1.5, torch.arange(6).reshape(2, 3))
    check(lambda x, y: x * y, torch.arange(6), torch.randn(6, dtype=torch.float64))
