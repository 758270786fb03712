"""Spawned worker processes, one op at a time each, with a per-op timeout.

Spawn, not fork: JAX's runtime threads do not survive fork. A worker that crashes or outlives the
timeout is killed and replaced; its op is recorded as an error, and the run goes on.
"""
from __future__ import annotations

import collections
import multiprocessing as mp
import time
from multiprocessing.connection import wait

from .. import config
from ..testing.workers import stop_worker

STARTUP_TIMEOUT = 600  # importing torch, torchneuron and op_db takes ~20 s, more on a busy machine
TASKS_PER_WORKER = 100  # a fresh process now and then bounds the growth of JAX's compile caches


def _worker(conn, variants: tuple[str, ...], max_samples: int) -> None:
    # Count fallbacks instead of refusing them. Set on config, not the environment: unpickling this
    # function imported torchneuron (and read the environment) before it ran.
    config.FALLBACK = "cpu"
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    from .runner import full_name, load_op_db, run_op_dtype

    torch.set_num_threads(1)
    ops = {full_name(op): op for op in load_op_db()}
    conn.send(("ready",))
    while (task := conn.recv()) is not None:
        name, dtypes = task
        records = [run_op_dtype(ops[name], getattr(torch, d), variants, max_samples) for d in dtypes]
        conn.send(("done", records))


class _Slot:
    def __init__(self, ctx, variants, max_samples):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, variants, max_samples), daemon=True)
        self.proc.start()
        child.close()
        self.ready, self.task, self.done = False, None, 0
        self.deadline = time.monotonic() + STARTUP_TIMEOUT

    def send(self, task, timeout):
        self.task, self.deadline = task, time.monotonic() + timeout
        self.conn.send(task)

    def stop(self, kill=False):
        stop_worker(self.conn, self.proc, kill)
        self.conn.close()


def _failed(task, reason, family_of) -> list[dict]:
    name, dtypes = task
    return [{"op": name, "family": family_of(name), "dtype": d, "status": "error", "reason": reason,
             "variants": {}, "fallbacks": {}, "seconds": 0.0} for d in dtypes]


def run_tasks(tasks, jobs, timeout, variants, max_samples, family_of, on_done):
    """Run (op name, [dtype names]) tasks; on_done(task, records) is called as each finishes."""
    ctx = mp.get_context("spawn")
    pending = collections.deque(tasks)
    slots: list[_Slot] = []
    while pending or any(s.task for s in slots):
        while len(slots) < min(jobs, len(pending) + sum(1 for s in slots if s.task)):
            slots.append(_Slot(ctx, variants, max_samples))
        for s in slots:
            if s.ready and s.task is None and pending:
                s.send(pending.popleft(), timeout)
        ready = wait([s.conn for s in slots], timeout=1.0)
        for s in list(slots):
            failure = None
            if s.conn in ready:
                try:
                    message = s.conn.recv()
                except (EOFError, OSError):
                    failure = f"crash: worker exited with code {s.proc.exitcode}"
                else:
                    if message[0] == "ready":
                        s.ready = True
                    else:
                        on_done(s.task, message[1])
                        s.task, s.done = None, s.done + 1
                        if s.done >= TASKS_PER_WORKER or not pending:
                            s.stop()
                            slots.remove(s)
                        continue
            if failure is None and time.monotonic() > s.deadline:
                failure = f"timeout after {timeout}s" if s.task else "worker failed to start"
            if failure:
                s.stop(kill=True)
                slots.remove(s)
                if s.task:
                    on_done(s.task, _failed(s.task, failure, family_of))
                elif not s.ready:
                    raise RuntimeError(f"conformance worker did not start: {failure}")
    for s in slots:
        s.stop()
