"""Worker processes of the tools (the conformance pool, the crash sweep): how one is stopped."""
from __future__ import annotations


def stop_worker(conn, proc, kill: bool = False) -> None:
    """Ask a worker to finish (None on its pipe) or kill it; one that is still alive after 10 s is
    killed."""
    if kill:
        proc.kill()
    else:
        try:
            conn.send(None)
        except OSError:
            pass  # it already died: its pipe is closed
    proc.join(10)
    if proc.is_alive():
        proc.kill()
        proc.join()
