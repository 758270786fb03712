"""Memory accounting, capacity and out-of-memory behaviour."""
import gc

import pytest
import torch

from torchneuron.runtime.core import lib


def test_allocated_bytes_follow_tensor_lifetimes():
    gc.collect()
    base = torch.neuron.memory_allocated()
    x = torch.empty(1024, device="neuron")
    assert torch.neuron.memory_allocated() == base + 4096
    assert torch.accelerator.memory_allocated(torch.device("neuron:0")) == base + 4096
    y = x + 1
    assert torch.neuron.memory_allocated() == base + 8192
    assert torch.neuron.max_memory_allocated() >= base + 8192
    del x, y
    assert torch.neuron.memory_allocated() == base
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == base
    stats = torch.neuron.memory_stats()
    assert stats["allocated_bytes.all.current"] == base


def test_views_share_one_allocation():
    base = torch.neuron.memory_allocated()
    x = torch.empty(256, device="neuron")
    views = [x[::2], x.view(16, 16).t(), x[10:20]]
    assert torch.neuron.memory_allocated() == base + 1024
    del x, views
    assert torch.neuron.memory_allocated() == base


def test_out_of_memory_raises_and_device_still_works():
    lib.tn_set_memory_limit(1, 1 << 20)
    try:
        keep = torch.empty(100_000, device="neuron:1")
        with pytest.raises(torch.OutOfMemoryError, match="neuron out of memory on device 1"):
            torch.empty(1_000_000, device="neuron:1")
        with pytest.raises(torch.OutOfMemoryError, match=r"in use of a limit of 1048576"):
            keep + keep + keep  # intermediates no longer fit
        del keep
        ok = torch.ones(100_000).to("neuron:1") * 2
        assert ok.sum().item() == 200_000
    finally:
        lib.tn_set_memory_limit(1, 1 << 40)


def test_storage_resize_keeps_contents():
    x = torch.arange(4.0).to("neuron")
    storage = x.untyped_storage()
    storage.resize_(32)
    torch.testing.assert_close(x.cpu(), torch.arange(4.0))
    x.resize_(8)
    assert x.untyped_storage().nbytes() == 32
    torch.testing.assert_close(x[:4].cpu(), torch.arange(4.0))
