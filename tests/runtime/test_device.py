"""The device itself: native tensors, several NeuronCores, the device module, streams, generators."""
import time

import pytest
import torch

import torchneuron
from torchneuron.testing.processes import last_json, run_code


def test_tensors_are_native():
    t = torch.ones(2, 3).to("neuron")
    assert type(t) is torch.Tensor
    assert t.device == torch.device("neuron:0")
    assert t.is_neuron
    assert t.untyped_storage().device == torch.device("neuron:0")
    assert t.untyped_storage().nbytes() == 24
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.accelerator.device_count() == torch.neuron.device_count() >= 2


def test_data_ptr_is_an_opaque_handle_not_host_memory():
    t = torch.arange(4.0).to("neuron")
    u = t[1:]
    assert u.data_ptr() == t.data_ptr() + 4
    assert u.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()


def test_copies_between_two_cores():
    x = torch.randn(5, 3)
    a = x.to("neuron:1")
    assert a.device == torch.device("neuron:1")
    b = a.to("neuron:0")
    assert b.device == torch.device("neuron:0")
    torch.testing.assert_close(b.cpu(), x)
    c = torch.empty(3, 5, device="neuron:0")
    c.copy_(a.t())  # strided source on another core
    torch.testing.assert_close(c.cpu(), x.t())


def test_the_same_op_on_each_core_stays_on_that_core():
    # one op, the same shapes, on neuron:0 then neuron:1: each result lives on its inputs' core
    x = torch.randn(6)
    for index in (0, 1, 0):
        a = x.to(f"neuron:{index}")
        before = torch.neuron.memory_allocated(index)
        y = a * 2 + a
        assert y.device == torch.device("neuron", index)
        assert torch.neuron.memory_allocated(index) > before
        torch.testing.assert_close(y.cpu(), 3 * x)


_FACTORIES = {
    "arange": lambda d: torch.arange(6, device=d),
    "full": lambda d: torch.full((6,), 2.5, device=d),
    "zeros": lambda d: torch.zeros(6, device=d),  # zero_ of a storage never written: its input goes unread
    "fill_": lambda d: torch.empty(6, device=d).fill_(1.5),
    "ones_like": lambda d: torch.ones_like(torch.empty(6, device=d)),
}


@pytest.mark.parametrize("name", sorted(_FACTORIES))
def test_factories_and_overwriting_ops_place_their_results_on_their_core(name):
    # the buffer itself lives on the tensor's core: these programs ran on core 0 when no argument
    # (or only an unread one) said where
    from torchneuron.runtime import storages
    make = _FACTORIES[name]
    for index in (1, 0):
        t = make(f"neuron:{index}")
        assert [d.id for d in storages.buffer_of(t).devices()] == [index]
        y = t * 2
        assert [d.id for d in storages.buffer_of(y).devices()] == [index]
        torch.testing.assert_close(y.cpu(), make("cpu") * 2)


def test_random_factories_place_their_results_on_their_core():
    from torchneuron.runtime import storages
    draws = []
    for index in (1, 0):
        torch.manual_seed(0)
        t = torch.randn(6, device=f"neuron:{index}")
        assert [d.id for d in storages.buffer_of(t).devices()] == [index]
        draws.append(t.cpu())
    torch.testing.assert_close(draws[0], draws[1])  # each core's generator, seeded alike


def test_device_context_and_current_device():
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(1):
        assert torch.neuron.current_device() == 1
        assert torch.empty(2, device="neuron").device == torch.device("neuron:1")
    assert torch.neuron.current_device() == 0


def test_invalid_device_index_is_a_clear_error():
    with pytest.raises(RuntimeError, match="Invalid neuron device index"):
        torch.empty(2, device="neuron:63")


def test_host_to_device_dtypes_roundtrip():
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                  torch.int8, torch.uint8, torch.bool, torch.complex64):
        x = (torch.randn(7) * 10).to(dtype)
        torch.testing.assert_close(x.to("neuron").cpu(), x)


def test_non_blocking_and_pinned_memory():
    x = torch.randn(8).pin_memory()
    assert x.is_pinned()
    y = x.to("neuron", non_blocking=True)
    torch.neuron.synchronize()
    torch.testing.assert_close(y.cpu(), x)
    assert not torch.randn(3).is_pinned()


def test_synchronize_after_results_died_or_were_donated():
    a, b = torch.randn(64).to("neuron"), torch.randn(64).to("neuron")
    for _ in range(40):
        kept = a * b  # results that die at once (the first call builds the plan, the rest reuse it)
    kept.add_(1)  # donates the buffer the last multiplication returned
    torch.neuron.synchronize()
    torch.testing.assert_close(kept.cpu(), a.cpu() * b.cpu() + 1)


@pytest.mark.parametrize("asynchronous", ["0", "1"])
def test_synchronize_leaves_every_live_buffer_computed(asynchronous):
    # inline XLA:CPU (TORCHNEURON_ASYNC_DISPATCH=0) has finished a call's work when it returns, so synchronize has
    # nothing to wait for; with asynchronous dispatch it waits for every live buffer
    code = """
        import json, torch, torchneuron
        from torchneuron.runtime import devices, storages
        x = torch.randn(1024, 1024).to("neuron")
        ys = [x @ x for _ in range(8)]  # queued (asynchronous): about a second of work
        with torchneuron.eager_mode("fused"):
            z = (ys[0] * 2).sum()  # pending until synchronize runs it
        torch.neuron.synchronize()
        ready = [all(b.is_ready() for b in storages.table().values())]
        # after a synchronize, the work of every kind of write: in place through a view, a copy in,
        # a graph replay, a fused segment
        step = torchneuron.capture(lambda a: (a @ a).relu())
        w = step(step(x))  # (a first call runs eagerly, the second records: later calls replay)
        torch.neuron.synchronize()
        def fused_write():
            with torchneuron.eager_mode("fused"):
                ys[4].add_(ys[5] @ ys[5])
        writes = {"in place through a view": lambda: ys[1][::2].mul_(ys[6][::2] @ ys[7]),
                  "a copy in": lambda: ys[2].copy_(torch.randn(1024, 1024)),
                  "a graph replay": lambda: step(ys[3]), "a fused segment": fused_write}
        for name, write in writes.items():
            made = write()
            w = made if name == "a graph replay" else w
            torch.neuron.synchronize()
            if not all(b.is_ready() for b in storages.table().values()):
                ready.append(name)
        ready.append(True)
        print(json.dumps({"asynchronous": devices.ASYNCHRONOUS, "ready": ready,
                          "value": z.item(), "expected": (ys[0].cpu() * 2).sum().item(),
                          "graph": ((w.cpu() - (ref := (ys[3].cpu() @ ys[3].cpu()).relu())).abs().max() / ref.abs().max()).item()}))
    """
    result = last_json(run_code(code, timeout=600, env={"TORCHNEURON_ASYNC_DISPATCH": asynchronous}))
    assert result["asynchronous"] is (asynchronous == "1") and result["ready"] == [True, True]
    # (a sum of a million values of ~60: its rounding is ~0.02, whatever the sum comes to)
    assert result["value"] == pytest.approx(result["expected"], rel=1e-5, abs=1.0)
    assert result["graph"] < 1e-5  # (a sum of 1,024 products of ~30: relative to the largest)


def test_synchronize_waits_only_for_what_was_written_since_the_last(monkeypatch):
    from torchneuron.runtime import devices
    from torchneuron.runtime import synchronize as sync_module
    if not devices.ASYNCHRONOUS:
        pytest.skip("inline dispatch: synchronize waits for nothing")
    held = [torch.randn(8).to("neuron") + i for i in range(300)]  # a model's worth of live storages
    torch.neuron.synchronize()
    waited = []
    real = sync_module.jax.block_until_ready
    monkeypatch.setattr(sync_module.jax, "block_until_ready", lambda xs: waited.append(len(xs)) or real(xs))

    def arrays_waited_for() -> int:
        torch.neuron.synchronize()
        return waited[-1]

    assert arrays_waited_for() == 0  # nothing written since the last one
    held[0].mul_(2)
    y = held[1] * 3
    assert arrays_waited_for() <= 4  # two storages written (and their calls' results)
    torch.testing.assert_close(y.cpu(), held[1].cpu() * 3)
    with torchneuron.eager_mode("strict"):
        for _ in range(40):
            held[0] * 2  # results that die at once: kept among the recent ones until a synchronize
    assert arrays_waited_for() >= 32
    del held[2:]
    assert arrays_waited_for() == 0  # freed storages leave nothing to wait for, nor do results waited for

def test_item_and_scalar_conversion():
    t = torch.tensor([1.5, -2.0]).to("neuron")
    assert t[0].item() == 1.5
    assert int(torch.tensor(7).to("neuron")) == 7
    assert bool(torch.tensor(True).to("neuron")) is True


def test_streams_and_events():
    s = torch.neuron.Stream()
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
        x = torch.ones(4).to("neuron") * 3
    assert torch.neuron.current_stream() != s
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    w = torch.randn(256, 256, device="neuron")
    before = time.perf_counter()
    start.record()
    y = x * 2
    z = w
    for _ in range(8):
        z = torch.tanh(z @ w)
    time.sleep(0.01)
    issued = time.perf_counter()
    end.record()  # a timed event waits for the work before it...
    after = time.perf_counter()
    assert torchneuron.eager_stats()["pending_ops"] == 0
    # ...so the pair spans the sleep and that wait, in milliseconds, and no more than the wall time around it
    elapsed = start.elapsed_time(end)
    assert max(10.0, (after - issued) * 1e3 - 1) <= elapsed <= (after - before) * 1e3 + 1, (elapsed, before, issued, after)
    assert end.query()
    s.wait_stream(torch.neuron.current_stream())
    y.record_stream(s)  # what DDP does to the inputs it moves
    torch.accelerator.synchronize()
    torch.testing.assert_close(y.cpu(), torch.full((4,), 6.0))



@pytest.mark.parametrize("core", [0, 1])
def test_streams_without_a_device_index_are_on_the_current_device(core):
    """As on CUDA: torch.Stream(device="neuron") and its relatives resolve to the current device."""
    previous = torch.neuron.current_device()
    torch.neuron.set_device(core)
    try:
        here = torch.device("neuron", core)
        for s in (torch.Stream(device="neuron"), torch.neuron.Stream(), torch.Stream(device=torch.device("neuron"))):
            assert s.device == here
            with torch.neuron.stream(s):
                assert torch.neuron.current_stream() == s
                assert torch.accelerator.current_stream() == s
                y = torch.ones(3, device="neuron") * 2
            assert torch.neuron.current_stream() != s
            assert s.query()
            s.synchronize()
            event = s.record_event()
            event.synchronize()
            assert event.query()
            torch.testing.assert_close(y.cpu(), torch.full((3,), 2.0))
        start, end = torch.Event(device="neuron", enable_timing=True), torch.Event(device="neuron", enable_timing=True)
        before = time.perf_counter()
        start.record()
        time.sleep(0.01)
        end.record()
        wall = (time.perf_counter() - before) * 1e3
        assert start.device == here and 10.0 <= start.elapsed_time(end) <= wall + 1
    finally:
        torch.neuron.set_device(previous)

def test_generator_state_roundtrip():
    g = torch.Generator(device="neuron")
    g.manual_seed(1234)
    assert g.initial_seed() == 1234
    g.set_offset(5)
    state = g.get_state()
    g.manual_seed(1)
    g.set_state(state)
    assert g.initial_seed() == 1234 and g.get_offset() == 5
    torch.neuron.manual_seed(7)
    assert torch.neuron.initial_seed() == 7
    saved = torch.neuron.get_rng_state()
    torch.neuron.set_rng_state(saved)


def test_device_module_api_table_is_complete():
    for name in torch.neuron.API:
        assert hasattr(torch.neuron, name), name
    assert torch.neuron.is_available()
    assert torch.neuron.get_amp_supported_dtype()
    assert torch.neuron.is_bf16_supported()


def test_device_properties():
    properties = torch.neuron.get_device_properties(0)
    assert properties.name == torch.neuron.get_device_name("neuron:0") and properties.name
    assert properties.total_memory == torch.neuron.mem_get_info(0)[1] > 0


def test_module_to_neuron_keeps_tied_weights():
    emb = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, head).to("neuron")
    assert model[1].weight is model[0].weight
    assert model[0].weight.device.type == "neuron"
    assert len(list(model.parameters())) == 1
