"""Programs run in fresh processes, one after the other, sharing a persistent cache (the tests of
what a warm start loads)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys


def runs_sharing_a_cache(program: str, cache_dir, argvs=((), ()), **env) -> list[dict]:
    """The JSON line `program` prints last, from one fresh process per entry of `argvs` (its
    arguments), each with `cache_dir` as TORCHNEURON_CACHE_DIR and `env` on top of ours."""
    environment = {**os.environ, "TORCHNEURON_CACHE_DIR": str(cache_dir), **env}
    results = []
    for argv in argvs:
        done = subprocess.run([sys.executable, "-c", program, *map(str, argv)], env=environment,
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def free_port() -> int:
    """A TCP port on the loopback interface nothing listens on now (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
