"""Collectives issued now and waited for later: the functional collectives of compiled graphs.

A compiled graph issues a collective as soon as its input is computed and waits for it only where a
later op needs the result, so the transport moves bytes while the device computes the ops between.
Each group runs its issued collectives in order on one worker thread of its own (every rank must run
a group's collectives in one order). The worker touches only JAX arrays, host tensors and the
transport, never the neuron tensor runtime: the caller reads the inputs' device values before it
issues, and `Issued.wait` makes the results neuron tensors on the caller's thread.

An eager collective on the group first waits for the issued ones (`NeuronProcessGroup` runs every
collective in program order), so eager and compiled collectives can be mixed freely.
"""
from __future__ import annotations

import collections
import concurrent.futures
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

from ..runtime import transfer

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
               "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
_worker_thread = threading.local()  # .group: the group whose worker this thread is
STATS = collections.Counter()


def stats() -> dict:
    """Issued collectives: how many, the seconds their jobs took on the workers (device read,
    transport, checks), and the seconds callers were blocked waiting for them. 1 - waited / busy
    is the share of collective time hidden behind the caller's compute."""
    return dict(STATS)


def reset_stats() -> None:
    STATS.clear()


def reduce_op(name: str):
    try:
        return _REDUCE_OPS[name.lower()]
    except KeyError:
        raise ValueError(f"neuron process group: unsupported reduce op {name!r} "
                         f"(expected one of {', '.join(_REDUCE_OPS)})") from None


class Queue:
    """One group's issued collectives, run in order on its worker thread."""

    def __init__(self, group):
        self.group = group
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.pending: list[concurrent.futures.Future] = []

    def submit(self, job) -> concurrent.futures.Future:
        if self.pool is None:
            self.pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="neuron-collectives", initializer=_mark_worker, initargs=(self.group,))
        self.pending = [f for f in self.pending if not f.done()]
        future = self.pool.submit(job)
        self.pending.append(future)
        return future

    def drain(self) -> None:
        """Wait for every issued collective (errors stay with their futures: their `wait` raises)."""
        if getattr(_worker_thread, "group", None) is self.group:
            return  # a job of this queue calling the group's own collectives
        pending, self.pending = self.pending, []
        concurrent.futures.wait(pending)


def _mark_worker(group) -> None:
    _worker_thread.group = group


class Issued:
    """A collective in flight. `wait()` returns its results as new neuron tensors (once; later calls
    return the same tensors) and raises what the transport raised: a dead or stalled peer, or ranks
    that disagree on the collective."""

    def __init__(self, future: concurrent.futures.Future, device: torch.device):
        self.future, self.device = future, device
        self.results: list[torch.Tensor] | None = None

    def wait(self) -> list[torch.Tensor]:
        if self.results is None:
            started = time.perf_counter()
            hosts = self.future.result()
            STATS["waited_s"] += time.perf_counter() - started
            self.results = [_to_device(h, self.device) for h in hosts]
        return self.results


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    flat = transfer.put(transfer.cpu_numpy(host).reshape(-1), device.index)
    return transfer.wrap(flat, tuple(host.shape), host.dtype, device)


def _staged(values, dtypes) -> list[torch.Tensor]:
    """Host tensors of the inputs' device values (on the worker: this waits for the device)."""
    return [transfer.host_tensor(np.asarray(v), d) for v, d in zip(values, dtypes)]


# ------------------------------------------------------------------------- the collectives
# Each takes the group, the inputs as host tensors and the op's own arguments, and returns the
# results as host tensors. They call the group's own collectives on host tensors, which go straight
# to the transport (with the group's check that every rank agrees on the collective).

def _all_reduce(group, hosts, op):
    if len({h.dtype for h in hosts}) > 1:
        return [r for h in hosts for r in _all_reduce(group, [h], op)]
    opts = dist.AllreduceCoalescedOptions()
    opts.reduceOp = reduce_op(op)
    group.allreduce_coalesced(hosts, opts)  # one transfer for the bucket, results written in place
    return hosts


def _all_gather(group, hosts, group_size):
    """One transport call for all of `hosts` (a bucket): each rank sends its inputs end to end, and
    each result is its column of the gathered table."""
    if len({h.dtype for h in hosts}) > 1:
        return [r for h in hosts for r in _all_gather(group, [h], group_size)]
    flat = torch.cat([h.reshape(-1) for h in hosts]) if len(hosts) > 1 else hosts[0].reshape(-1).contiguous()
    table = torch.empty((group_size, flat.numel()), dtype=flat.dtype)
    group.all_gather_single(table.view(-1), flat)
    results, offset = [], 0
    for h in hosts:
        rows = table[:, offset:offset + h.numel()]
        results.append(rows.reshape((group_size * h.shape[0], *h.shape[1:]) if h.dim() else (group_size,)))
        offset += h.numel()
    return results


def _reduce_scatter(group, hosts, op, group_size):
    """One transport call for all of `hosts`: rank r's share of every input, end to end, is row r
    of the table scattered."""
    if len({h.dtype for h in hosts}) > 1:
        return [r for h in hosts for r in _reduce_scatter(group, [h], op, group_size)]
    shares = [h.reshape(group_size, -1) for h in hosts]
    table = torch.cat(shares, dim=1) if len(shares) > 1 else shares[0]
    out = torch.empty(table.shape[1], dtype=table.dtype)
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = reduce_op(op)
    group.reduce_scatter_single(out, table.contiguous().view(-1), opts)
    return [piece.view((h.shape[0] // group_size, *h.shape[1:]))
            for piece, h in zip(out.split([s.shape[1] for s in shares]), hosts)]


def _all_to_all(group, hosts, output_splits, input_splits):
    (h,) = hosts
    rows = sum(output_splits) if output_splits else h.shape[0]
    out = torch.empty((rows, *h.shape[1:]), dtype=h.dtype)
    group.all_to_all_single(out, h.contiguous(), list(output_splits), list(input_splits))
    return [out]


def _broadcast(group, hosts, src):
    opts = dist.BroadcastOptions()
    opts.rootRank = src
    group.broadcast(hosts, opts)
    return hosts


COLLECTIVES = {
    "all_reduce": _all_reduce,
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "all_to_all": _all_to_all,
    "broadcast": _broadcast,
}


def issue(group, name: str, inputs: list[torch.Tensor], *arguments) -> Issued:
    """Start collective `name` (a key of COLLECTIVES) of neuron tensors `inputs` on `group` (a
    NeuronProcessGroup); returns at once. The inputs' values are read now: later writes to the
    inputs do not change what is sent."""
    run = COLLECTIVES[name]
    # Copies on the device: an input's storage may be written (its buffer donated) before the worker
    # reads it. Dispatched, not waited for.
    values = [transfer.value_of(t).copy() for t in inputs]
    dtypes = [t.dtype for t in inputs]
    def job():
        started = time.perf_counter()
        try:
            return run(group, _staged(values, dtypes), *arguments)
        finally:
            STATS["busy_s"] += time.perf_counter() - started

    STATS["issued"] += 1
    future = group.in_flight.submit(job)
    return Issued(future, inputs[0].device)
