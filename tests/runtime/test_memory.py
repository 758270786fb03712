"""Memory accounting, capacity and out-of-memory behaviour."""
import gc

import pytest
import torch

from torchneuron.runtime import devices
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


def test_statistics_split_by_pool_as_cudas_caching_allocator_does():
    """Requests of up to 1 MiB count in the small pool, larger ones in the large pool; "all" is their sum."""
    torch.neuron.synchronize()
    before = torch.neuron.memory_stats()
    small, large = torch.empty(256, device="neuron"), torch.empty(1 << 19, device="neuron")  # 1 KiB, 2 MiB
    during = torch.neuron.memory_stats()

    def grew(name):
        return during[name] - before[name]

    assert grew("allocated_bytes.small_pool.current") == 1024 and grew("allocation.small_pool.current") == 1
    assert grew("allocated_bytes.large_pool.current") == 2 << 20 and grew("allocation.large_pool.current") == 1
    for kind in ("allocated_bytes", "active_bytes", "reserved_bytes", "allocation", "active"):
        for metric in ("current", "allocated", "freed"):  # (peaks of the pools come at other times)
            assert during[f"{kind}.all.{metric}"] == \
                during[f"{kind}.small_pool.{metric}"] + during[f"{kind}.large_pool.{metric}"]
    del small, large
    after = torch.neuron.memory_stats()
    assert after["allocated_bytes.small_pool.freed"] - during["allocated_bytes.small_pool.freed"] == 1024
    assert after["allocated_bytes.large_pool.current"] == before["allocated_bytes.large_pool.current"]


def test_cudas_memory_functions():
    x = torch.empty(1000, device="neuron")
    nested = torch.neuron.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == torch.neuron.memory_stats()["allocated_bytes.all.current"]
    summary = torch.neuron.memory_summary()
    assert "Allocated memory" in summary and str(torch.neuron.memory_stats()["allocated_bytes.all.current"]) in summary
    torch.neuron.reset_accumulated_memory_stats()
    assert torch.neuron.memory_stats()["allocated_bytes.all.allocated"] == 0
    with pytest.warns(FutureWarning, match="memory_reserved"):
        assert torch.neuron.memory_cached() == torch.neuron.memory_reserved()
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        torch.neuron.reset_max_memory_allocated()
    assert torch.neuron.max_memory_allocated() == torch.neuron.memory_allocated()
    del x


def test_per_process_memory_fraction_caps_allocations():
    total = torch.neuron.mem_get_info(1)[1]
    assert torch.neuron.get_per_process_memory_fraction(1) == 1.0
    with pytest.raises(ValueError, match="Invalid fraction"):
        torch.neuron.set_per_process_memory_fraction(1.5, 1)
    torch.neuron.set_per_process_memory_fraction(1e-6, 1)
    try:
        assert torch.neuron.get_per_process_memory_fraction(1) == 1e-6
        with pytest.raises(torch.OutOfMemoryError, match="neuron out of memory on device 1"):
            torch.empty(int(total * 1e-6) // 4 + 1024, device="neuron:1")
        torch.empty(16, device="neuron:1")  # what fits still allocates
        torch.neuron.set_per_process_memory_fraction(1.0, 1)
        assert torch.neuron.mem_get_info(1)[1] == devices.default_memory_limit(1)
    finally:
        lib.tn_set_memory_limit(1, total)  # what the tests before left
