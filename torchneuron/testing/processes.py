"""Programs the tests run in fresh processes: Python code or scripts (`run_code`, `run_python`), the same under
torchrun (`run_torchrun`), a few side by side (`start_code`), and one after the other sharing a persistent cache
(the tests of what a warm start loads)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap


def environment(env: dict | None = None) -> dict:
    """Our environment with `env` on top; a value of None removes that variable."""
    merged = {**os.environ, **(env or {})}
    return {name: value for name, value in merged.items() if value is not None}


def run_python(*argv, env: dict | None = None, cwd=None, timeout: float = 300,
               ok: bool = True) -> subprocess.CompletedProcess:
    """`python *argv` (this interpreter) in a fresh process, with `environment(env)`, stdout and stderr captured
    as text. With `ok` (the default) it must exit 0; the assertion shows the end of its stderr."""
    done = subprocess.run([sys.executable, *map(str, argv)], env=environment(env), cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)
    if ok:
        assert done.returncode == 0, f"exit status {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def run_code(code: str, *argv, **options) -> subprocess.CompletedProcess:
    """`python -c code *argv` (`code` dedented), as `run_python` runs it."""
    return run_python("-c", textwrap.dedent(code), *argv, **options)


def run_torchrun(*argv, processes: int = 2, **options) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node=processes --master-port=<a free one> *argv`, as `run_python` runs it."""
    return run_python("-m", "torch.distributed.run", f"--nproc-per-node={processes}", "--master-port",
                      free_port(), *argv, **options)


def start_code(code: str, *argv, env: dict | None = None, cwd=None) -> subprocess.Popen:
    """`python -c code *argv` started and not waited for (processes that must run at the same time); its
    stdout and stderr are pipes of text: `communicate()` collects them."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, argv)], env=environment(env),
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def last_json(stdout) -> dict:
    """The JSON object a program printed last: from its stdout, or from a `run_*` result."""
    if isinstance(stdout, subprocess.CompletedProcess):
        stdout = stdout.stdout
    return json.loads(stdout.strip().splitlines()[-1])


def runs_sharing_a_cache(program: str, cache_dir, argvs=((), ()), **env) -> list[dict]:
    """The JSON line `program` prints last, from one fresh process per entry of `argvs` (its
    arguments), each with `cache_dir` as TORCHNEURON_CACHE_DIR and `env` on top of ours."""
    return [last_json(run_code(program, *argv, env={"TORCHNEURON_CACHE_DIR": str(cache_dir), **env}))
            for argv in argvs]


def free_port() -> int:
    """A TCP port on the loopback interface nothing listens on now (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
