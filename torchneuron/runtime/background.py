"""A worker thread that runs submitted jobs one at a time, in order, off the calling thread.

It starts with the first job and ends once its queue is empty, or once the main thread has ended:
a process that exits waits for the job in progress at most (queued ones are dropped). Long jobs
check `stopping()` between their steps. Background promotions to full optimisation
(executables.py) and warm-start prefetching (prefetch.py) each have one.
"""
from __future__ import annotations

import collections
import contextlib
import os
import threading
import weakref


def stopping() -> bool:
    """Whether the process is ending (the main thread is done): long jobs stop early."""
    return not threading.main_thread().is_alive()


class BackgroundQueue:
    def __init__(self, name: str):
        self.name = name
        self._reset()
        _QUEUES.add(self)

    def _reset(self) -> None:
        self.jobs: collections.deque = collections.deque()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def submit(self, job) -> None:
        with self.lock:
            self.jobs.append(job)
            if self.thread is None:
                self.thread = threading.Thread(target=self._work, name=self.name)
                self.thread.start()

    def _work(self) -> None:
        while True:
            with self.lock:
                if not self.jobs or stopping():
                    self.jobs.clear()
                    self.thread = None
                    return
                job = self.jobs.popleft()
            with contextlib.suppress(Exception):  # (a failed job loses its own work, not the thread)
                job()

    def wait(self) -> None:
        """Until every job submitted so far has run (tests, benchmarks)."""
        while True:
            with self.lock:
                thread = self.thread
            if thread is None:
                return
            thread.join()


_QUEUES: weakref.WeakSet = weakref.WeakSet()


def _forked() -> None:
    """A forked child has no worker thread (only the one that forked runs in it): it starts empty."""
    for queue in list(_QUEUES):
        queue._reset()


os.register_at_fork(after_in_child=_forked)
