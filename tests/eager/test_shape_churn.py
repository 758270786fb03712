"""Shapes that keep changing (a data loader's variable-length batches): uploads of new lengths
compile nothing, ops on them compile O(log n) programs, and every plan, program and segment table
stays within its bound."""
import torch

import torchneuron
from torchneuron.eager import driver
from torchneuron.runtime import executables, host_memory, tables

LENGTHS = [1 + 37 * i for i in range(300)]


def _misses() -> int:
    return torchneuron.cache_stats()["misses"]  # (compiles and persistent-cache loads)


def _within_bounds() -> None:
    for name, table in torchneuron.cache_stats()["tables"].items():
        assert table["entries"] <= table["limit"], (name, table)


def test_uploads_of_new_lengths_compile_nothing():
    torch.manual_seed(0)
    before = _misses()
    for i, n in enumerate(LENGTHS):
        host = torch.randn(n) if i % 3 else torch.randint(-9, 9, (n,))
        device = host.to("neuron")
        assert torch.equal(device.cpu(), host)
    for n in LENGTHS[:60]:  # `.to()` of a transposed tensor keeps its strides
        host = torch.randn(3, n).t()
        device = host.to("neuron")
        assert device.stride() == host.stride() and torch.equal(device.cpu(), host)
        values = [float(v) for v in range(n % 7 + 1)]
        assert torch.equal(torch.tensor(values, device="neuron").cpu(), torch.tensor(values))
    assert _misses() == before  # no program for any length
    _within_bounds()


def test_ops_on_new_lengths_compile_per_bucket_not_per_length():
    torch.manual_seed(0)
    _ = [(torch.randn(n).to("neuron") * 2).cpu() for n in (5, 6, 7)]  # the op's stream starts
    before = _misses()
    for n in LENGTHS:
        host = torch.randn(n)
        assert torch.equal((host.to("neuron") * 2).cpu(), host * 2)
    # one bucket (power of two) per program, not one per length: 300 lengths up to 11,064
    assert _misses() - before <= 24
    _within_bounds()


def test_the_plan_table_forgets_its_oldest_plans_past_its_limit(monkeypatch):
    monkeypatch.setattr(driver._BUILT, "limit", 16)
    x = torch.zeros(40, device="neuron")
    for n in range(1, 40):  # an in-place op runs at exact sizes: a plan per length
        x[:n].add_(1)
    expected = torch.arange(39, 0, -1, dtype=torch.float32)
    assert torch.equal(x.cpu()[:39], expected)
    assert sum(map(len, driver.PLANS.values())) <= 16
    x[:3].add_(1)  # a forgotten plan is built again
    assert torch.equal(x.cpu()[:3], expected[:3] + 1)


def test_bounded_table_drops_oldest_and_reports():
    dropped = []
    table = tables.BoundedTable("test table", 3, on_drop=lambda k, v: dropped.append(k))
    for k in range(5):
        table.add(k, str(k))
    table.add(2, "again")  # the newest again
    table.add(5, "5")
    assert list(table) == [4, 2, 5] and dropped == [0, 1, 3]
    table.discard(4, "not its value")
    table.discard(2, "again")
    assert list(table) == [4, 5]
    assert tables.report()["test table"] == {"entries": 2, "limit": 3}
    tables._REGISTERED.pop("test table")  # (not one of the process's tables)


def test_a_program_shared_by_thousands_of_plans_calls_each_callback_once():
    function = executables.Function(lambda x: x, "runtime", "test")
    called = []
    for k in range(3000):  # nested pairs of callbacks went past the recursion limit
        executables.when_empty(function, lambda k=k: called.append(k), token=k % 2000)
    executables.forget_when_empty(function, 0)
    function.on_empty()
    assert len(called) == 1999 and 0 not in called and 2999 in called


def test_host_memory_is_trimmed_when_the_heap_keeps_growing(monkeypatch):
    heap, trims = [100 << 20], []

    class Info:
        @property
        def arena(self):
            return heap[0]

    monkeypatch.setattr(host_memory, "_LIBC", (Info, lambda pad: trims.append(pad)))
    monkeypatch.setattr(host_memory, "_heap_after_trim", heap[0])
    monkeypatch.setattr(host_memory, "_freed", 0)
    for _ in range(5):  # a steady loop: the heap keeps its size
        host_memory.freed(host_memory.CHECK_EVERY)
    assert trims == []
    heap[0] += host_memory.TRIM_AFTER + 1  # new sizes past the free holes
    host_memory.freed(host_memory.CHECK_EVERY)
    assert trims == [0]
