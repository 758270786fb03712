"""torchneuron.stats(): every counter by area, and each area's own function a view of it."""
import torch

import torchneuron
from torchneuron import counters


def test_stats_has_every_area_and_each_function_is_its_view():
    x = torch.arange(6.0, device="neuron")
    (x * 2).sum().item()
    report = torchneuron.stats()
    assert set(report) == set(counters.AREAS) >= {"eager", "compile", "cache", "fallback", "memory"}
    assert all(isinstance(area, dict) for area in report.values())
    assert report["fallback"] == torchneuron.fallback_stats()
    assert report["compile"] == torchneuron.compile.compile_stats()
    assert report["eager"].keys() == torchneuron.eager_stats().keys()
    assert report["cache"].keys() == torchneuron.cache_stats().keys()
    assert report["memory"]["neuron:0"].keys() == torch.neuron.memory_stats(0).keys()
