"""torch.profiler records neuron ops with their device time, and compiles as their own events."""
import json

import torch

from torchneuron.profiler import COMPILE, PREFIX, top_ops


def _step(x):
    return (x @ x.T + 1.5).relu().sum()


def test_trace_has_neuron_ops_with_durations(tmp_path):
    x = torch.randn(8, 8, device="neuron")
    x17 = torch.randn(17, 3, device="neuron")  # a shape no other test uses: its plans compile here
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _step(x17)
        _step(x)
        _step(x)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["name"] for e in events if e.get("ph") == "X"}
    assert f"{PREFIX}aten.mm.default" in names
    assert f"{COMPILE}aten.mm.default" in names
    assert all(e["dur"] >= 0 for e in events if e.get("name", "").startswith(PREFIX))
    table = top_ops(prof, 5)
    assert "aten.mm.default" in table and len(table.splitlines()) <= 6


def test_no_events_outside_profiling():
    from torchneuron.eager import driver
    active, _ = driver._hook  # installed, and inactive outside a profiler
    assert not active()
    x = torch.ones(3, device="neuron")
    assert torch.equal((x + 1).cpu(), torch.full((3,), 2.0))
