"""Strict and fused eager execution, chosen per program (TORCHNEURON_EAGER) or per block.

    with torchneuron.eager_mode("fused"):
        loss = model(x).sum()          # recorded, not run
    print(loss.item())                 # needs a value: the recorded ops run as one program

Strict runs each op's executable as it is called. Fused records the same plans (every error of
shapes, dtypes or arguments is still raised at the call) and runs them as one fused segment when
a value is needed (runtime/deferred.py). Both compute the same values.
"""
from __future__ import annotations

import contextlib

from ..runtime import deferred
from . import buckets, plan_store

MODES = ("strict", "fused")


@contextlib.contextmanager
def eager_mode(mode: str):
    """Run the block's neuron ops in `mode`, "strict" or "fused"; the previous mode after it
    (leaving fused execution runs what it recorded)."""
    if mode not in MODES:
        raise ValueError(f"eager_mode({mode!r}): expected one of {MODES}")
    with deferred.fused(mode == "fused"):
        yield


def eager_stats() -> dict:
    """The current mode and fused eager's counters: ops recorded, segments run and compiled,
    cache hits, cached segment programs, ops pending now, and flushes per reason; and eager
    bucketing's: calls run at a bucket, bucketed plans built and refused; and the eager plans built
    from meta kernels in this process against those read from the persistent cache."""
    return {**deferred.stats(), **buckets.stats(), **plan_store.stats()}


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    if deferred.has_pending() and not deferred.capturing():  # (a captured step runs at its replay)
        deferred.flush("optimizer step")


def install() -> None:
    """Cut fused segments where a training step ends: every step then records the same segments,
    which compile once (cut only by length, a loop's segments would start at a different op of the
    step each time, each a new program)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_after_optimizer_step)
