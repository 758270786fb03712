"""Describing a call: which CPU tensors a neuron call takes, and the error for the rest.

CUDA's rule, which neuron follows: 0-dim CPU tensors take part as scalars in any op; advanced
indexing (`index`, `index_put_` and their relatives, so `x[idx]`, `x[mask] = v`) also takes CPU
indices and masks, moved to the device; every other CPU tensor is a device mix.
"""
import pytest
import torch

from torchneuron.eager import describe
from torchneuron.eager.schema import parse

aten = torch.ops.aten
SAME_DEVICE = "Expected all tensors to be on the same device"


def _pair(shape=(5, 4)):
    x = torch.randn(shape)
    return x, x.to("neuron")


@pytest.mark.parametrize("index", [
    lambda: (torch.tensor([1, 3, -1]),),
    lambda: (torch.tensor([[0, 2], [4, 1]]),),
    lambda: (torch.tensor([True, False, True, False, True]),),
    lambda: (slice(None), torch.tensor([0, 3])),
    lambda: (torch.tensor([0, 4]), torch.tensor([1, 2])),
    lambda: (torch.tensor(2),),
    lambda: (torch.randn(5, 4) > 0,),
])
def test_cpu_indices_and_masks_read_as_on_cuda(index):
    x, xn = _pair()
    index = index()
    got = xn[index]
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), x[index])


@pytest.mark.parametrize("index, value", [
    (lambda: (torch.tensor([1, 3]),), lambda: torch.randn(2, 4)),
    (lambda: (torch.tensor([True, False, True, False, False]),), lambda: torch.tensor(7.0)),
    (lambda: (torch.randn(5, 4) > 0,), lambda: torch.tensor(-1.0)),
    (lambda: (slice(None), torch.tensor([0, 2])), lambda: torch.randn(5, 2)),
])
def test_cpu_indices_and_masks_write_as_on_cuda(index, value):
    x, xn = _pair()
    index, v = index(), value()
    vn = v if v.dim() == 0 else v.to("neuron")  # a 0-dim value may stay on CPU, as on CUDA
    x[index] = v
    xn[index] = vn
    torch.testing.assert_close(xn.cpu(), x)
    x[index] = 2.5  # a Python number
    xn[index] = 2.5
    torch.testing.assert_close(xn.cpu(), x)


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_takes_cpu_indices(accumulate):
    x, xn = _pair()
    idx = (torch.tensor([0, 2, 2]), torch.tensor([1, 3, 3]))
    v = torch.randn(3)
    x.index_put_(idx, v, accumulate=accumulate)
    xn.index_put_(idx, v.to("neuron"), accumulate=accumulate)
    torch.testing.assert_close(xn.cpu(), x)
    got = torch.index_put(xn, idx, v.to("neuron"), accumulate)
    torch.testing.assert_close(got.cpu(), torch.index_put(x, idx, v, accumulate))
    out = torch.empty(5, 4, device="neuron")
    aten.index.Tensor_out(xn, [idx[0]], out=torch.empty(0, device="neuron"))
    torch.testing.assert_close(aten.index.Tensor_out(xn, [idx[0]], out=out[:3]).cpu(), x[idx[0]])


def test_cpu_indices_move_once_per_call():
    xn = torch.randn(6, 3).to("neuron")
    idx = torch.tensor([0, 5])
    args, kwargs = describe.move_host_operands(
        parse(aten.index.Tensor), (xn, [idx, None]), {})
    assert args[0] is xn and args[1][0].device == xn.device and args[1][1] is None and not kwargs


def test_cpu_values_and_other_ops_keep_the_same_device_error():
    x, xn = _pair()
    idx = torch.tensor([0, 1])
    with pytest.raises(RuntimeError, match=SAME_DEVICE):  # a CPU value tensor, as on CUDA
        xn.index_put_((idx,), torch.randn(2, 4))
    with pytest.raises(RuntimeError, match=SAME_DEVICE):  # CPU self, neuron indices
        x[idx.to("neuron")]
    # CUDA refuses CPU indices everywhere else (TensorIterator's device check, or the op's own)
    for call in (lambda: xn.index_select(0, idx), lambda: xn.index_fill_(0, idx, 1.0),
                 lambda: torch.gather(xn, 0, torch.zeros(2, 4, dtype=torch.long)),
                 lambda: xn.scatter_(0, torch.zeros(1, 4, dtype=torch.long), 1.0),
                 lambda: xn.masked_fill_(torch.ones(5, 4, dtype=torch.bool), 1.0),
                 lambda: xn.index_add_(0, idx, torch.ones(2, 4).to("neuron"))):
        with pytest.raises(RuntimeError, match=SAME_DEVICE):
            call()
