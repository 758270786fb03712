"""Shared timing for the benchmarks: the median over rounds of the mean time per call."""
from __future__ import annotations

import statistics
import time

import torch


def sync_for(device: str):
    """What waits for `device`'s queued work (nothing on CPU, which runs synchronously)."""
    return torch.neuron.synchronize if device == "neuron" else (lambda: None)


def seconds_per_call(fn, sync, repeat: int, rounds: int, warmup: int) -> float:
    """Median over `rounds` of the mean seconds per call of `fn`, after `warmup` calls; waits for
    the device at the end of each round."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        sync()
        times.append((time.perf_counter() - start) / repeat)
    return statistics.median(times)
