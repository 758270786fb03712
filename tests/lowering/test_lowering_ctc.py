import pytest
import torch
import torch.nn.functional as F

from tests.reference import check

pytestmark = pytest.mark.usefixtures("lowered_only")
aten = torch.ops.aten

T, N, C = 7, 4, 5
PADDED = torch.tensor([[1, 2, 2], [1, 1, 0], [3, 4, 0], [4, 4, 4]])
CONCATENATED = torch.tensor([1, 2, 2, 1, 3, 4, 4])  # lengths 3, 1, 1, 2


def loss(targets, input_lengths, target_lengths, **kwargs):
    def run(x):
        t = targets.to(x.device)
        il = input_lengths.to(x.device) if isinstance(input_lengths, torch.Tensor) else input_lengths
        tl = target_lengths.to(x.device) if isinstance(target_lengths, torch.Tensor) else target_lengths
        return F.ctc_loss(x.log_softmax(2), t, il, tl, **kwargs)
    return run


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_loss_and_gradient(dtype, reduction, zero_infinity):
    x = torch.randn(T, N, C, dtype=dtype)
    # batch 2 cannot align its target in 2 steps (infinite loss)
    lengths = ([7, 5, 2, 7], [3, 1, 2, 2])
    check(loss(PADDED, *lengths, reduction=reduction, zero_infinity=zero_infinity), x, grad=True)
    check(loss(PADDED, *map(torch.tensor, lengths), reduction=reduction, zero_infinity=zero_infinity), x,
          grad=True)
    check(loss(CONCATENATED, [7, 5, 3, 7], [3, 1, 1, 2], reduction=reduction, zero_infinity=zero_infinity), x,
          grad=True)


@pytest.mark.parametrize("blank", [0, 4])
def test_blank_and_edge_lengths(blank):
    x = torch.randn(T, N, C, dtype=torch.float64)
    targets = torch.where(PADDED == blank, 2, PADDED)
    # an empty target, an empty input, and repeated labels that need a blank between them
    check(loss(targets, [7, 0, 7, 6], [3, 0, 0, 3], blank=blank, reduction="none"), x, grad=True)
    check(loss(targets, [7, 0, 1, 6], [3, 1, 2, 3], blank=blank, reduction="sum", zero_infinity=True), x, grad=True)


def test_target_ending_in_the_blank_label():
    # invalid but accepted: CPU's last step keeps only one of the two end positions
    x = torch.randn(T, 1, C, dtype=torch.float64)
    check(loss(torch.tensor([[3, 0]]), [3], [2], reduction="sum"), x, grad=True)


@pytest.mark.parametrize("overload", ["default", "Tensor"])
def test_private_ops(overload):
    log_probs = torch.randn(T, N, C, dtype=torch.float64).log_softmax(2)
    il, tl = [7, 5, 2, 7], [3, 1, 2, 2]
    if overload == "Tensor":
        il, tl = torch.tensor(il), torch.tensor(tl)
    forward, backward = getattr(aten._ctc_loss, overload), getattr(aten._ctc_loss_backward, overload)

    def run(lp, targets):
        move = (lambda t: t.to(lp.device)) if overload == "Tensor" else (lambda t: t)
        nll, log_alpha = forward(lp, targets, move(il), move(tl), 0, False)
        grad = backward(torch.ones_like(nll), lp, targets, move(il), move(tl), nll, log_alpha, 0, False)
        # log_alpha is only defined within each input and extended target (CPU leaves the rest unset)
        return nll, grad, log_alpha[0, :7, :7], log_alpha[3, :7, :5]
    check(run, log_probs, PADDED)


def test_long_sequences_float32():
    # the OpInfo's sizes: alpha and beta reach |log| ~ 200, where float32's rounding (on CPU as here)
    # moves the gradient by ~1e-4 from float64's
    x = torch.rand(50, 16, 20) * 18 - 9
    targets = torch.randint(1, 20, (16, 30))
    lengths = ([50] * 16, torch.randint(10, 30, (16,)).tolist())
    check(loss(targets, *lengths, reduction="sum"), x, grad=True, rtol=1e-4, atol=1e-4)
    check(loss(targets, *lengths, reduction="sum"), x.double(), grad=True)
