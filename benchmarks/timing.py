"""Shared timing for the benchmarks.

This machine runs in phases: for seconds to minutes at a time every Python loop, PyTorch CPU's
included, runs about 1.7x slower. Timing one case after another lets a phase land on one case
and not the other, so cases are timed in interleaved rounds (every round times each case once)
and each case reports its fastest round: both sides of a ratio then see the same phases.
"""
from __future__ import annotations

import time

import torch


def sync_for(device: str):
    """What waits for `device`'s queued work (nothing on CPU, which runs synchronously)."""
    return torch.neuron.synchronize if device == "neuron" else (lambda: None)


def interleaved_seconds_per_call(cases: dict, repeat: int, rounds: int, warmup: int) -> dict:
    """`cases`: name -> (fn, sync). For each name, the fastest over `rounds` of the mean seconds
    per call of `fn` (each round `repeat` calls, then `sync`), after `warmup` calls; every round
    times every case once, in turn."""
    for fn, sync in cases.values():
        for _ in range(warmup):
            fn()
        sync()
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(rounds):
        for name, (fn, sync) in cases.items():
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            sync()
            best[name] = min(best[name], (time.perf_counter() - start) / repeat)
    return best
