"""runtime/transfer.py: values into and out of storages, through copies in every direction."""
import warnings

import pytest
import torch

from torchneuron.runtime import storages, transfer


def test_one_upload_makes_one_device_buffer(monkeypatch):
    made = []
    put = transfer.put

    def counting_put(array, device_index):
        made.append(put(array, device_index))
        return made[-1]

    monkeypatch.setattr(transfer, "put", counting_put)
    x = torch.randn(8, 8)
    t = x.to("neuron")
    # the uploaded buffer is the storage's buffer: no staging tensor, no copy executable
    assert len(made) == 1 and storages.lookup(t.data_ptr()) is made[0]
    torch.testing.assert_close(t.cpu(), x)


def test_upload_copies_host_memory():
    x = torch.arange(16.0)
    t = x.to("neuron")
    x.add_(100)  # the device holds its own copy, not a view of host memory
    torch.testing.assert_close(t.cpu(), torch.arange(16.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64,
                                   torch.float8_e4m3fn])
def test_round_trip_dtypes(dtype):
    x = torch.randn(5, 3).to(dtype)
    assert torch.equal(x.to("neuron").cpu(), x)


@pytest.mark.parametrize("make_dst", [
    lambda d: d.t(),                 # transposed: covers its storage, not contiguously
    lambda d: d[1:3],                # a block inside the storage
    lambda d: d[:, ::2],             # strided
    lambda d: d.conj() if d.is_complex() else d.neg().neg(),
])
def test_host_copy_into_views_matches_cpu(make_dst):
    for dtype in (torch.float32, torch.complex64):
        base_cpu = torch.zeros(4, 4, dtype=dtype)
        base = base_cpu.to("neuron")
        src = torch.randn(make_dst(base_cpu).shape, dtype=dtype)
        make_dst(base_cpu).copy_(src)
        make_dst(base).copy_(src)
        torch.testing.assert_close(base.cpu(), base_cpu)


def test_host_copy_casts_and_broadcasts_as_cpu():
    dst_cpu, dst = torch.zeros(3, 4, dtype=torch.float16), torch.zeros(3, 4, dtype=torch.float16, device="neuron")
    src = torch.arange(4, dtype=torch.int64)  # cast and broadcast
    dst_cpu.copy_(src)
    dst.copy_(src)
    torch.testing.assert_close(dst.cpu(), dst_cpu)
    real_cpu, real = torch.zeros(3), torch.zeros(3, device="neuron")
    z = torch.randn(3, dtype=torch.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (PyTorch warns once per process that the imaginary part goes)
        real_cpu.copy_(z)
        real.copy_(z)
    torch.testing.assert_close(real.cpu(), real_cpu)


def test_copy_between_cores():
    x = torch.randn(6, 2)
    a = x.to("neuron:0")
    b = torch.zeros(2, 6, device="neuron:1")
    b.t().copy_(a)
    assert b.device == torch.device("neuron:1")
    torch.testing.assert_close(b.cpu(), x.t())
    c = a.to("neuron:1", dtype=torch.float64)
    torch.testing.assert_close(c.cpu(), x.double())


def test_assign_and_value_of():
    t = torch.zeros(4, 4, device="neuron")
    view = t[1:3, ::2]
    transfer.assign(view, transfer.put(torch.arange(4.0).numpy(), 0))
    expected = torch.zeros(4, 4)
    expected[1:3, ::2] = torch.arange(4.0).view(2, 2)
    torch.testing.assert_close(t.cpu(), expected)
    assert tuple(transfer.value_of(view).shape) == (2, 2)
