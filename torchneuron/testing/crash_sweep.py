"""Finds ops that kill the process when called with neuron tensors.

A neuron tensor's data pointer is an opaque handle inside a PROT_NONE reservation: a kernel that
reads it on the host faults. Our own kernels and the boxed fallback never do, but an op whose
PrivateUse1 slot is served by a composite kernel (CompositeExplicitAutograd's "default backend
kernel", CompositeImplicitAutograd's "math kernel") runs PyTorch's code on our tensors, and some
of that code reads memory directly (`_grid_sampler_2d_cpu_fallback` does).

    python -m torchneuron.testing.crash_sweep [--only aten::foo,aten::bar] [--timeout 60]

calls every such op with arguments made from its schema, in spawned worker processes (JAX does
not survive fork), one op at a time; a worker that dies by a signal is replaced, and its op is
reported. A Python exception is a fine answer; only a dead process is a find.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import re
import sys
import time
from collections.abc import Iterable, Iterator

import torch

from .workers import stop_worker

COMPOSITE = ("default backend kernel", "math kernel")
STARTUP_TIMEOUT = 600  # importing torch and torchneuron on a busy machine
# Tensor arguments tried in turn until a call returns: the dtype and shape a kernel wants reach
# the code that reads memory; a wrong one usually raises first.
TENSOR_VARIANTS = (
    (torch.float32, (2, 2)),
    (torch.float32, (1, 1, 2, 2)),
    (torch.float32, (2,)),
    (torch.int64, (2, 2)),
    (torch.bool, (2, 2)),
    (torch.complex64, (2, 2)),
    (torch.float32, (1, 1, 1, 2, 2)),
    (torch.uint8, (1, 1, 2, 2)),
)
STRINGS = {"reduce": "sum", "reduction": "sum", "approximate": "none", "padding": "valid", "indexing": "ij",
           "interpolation": "linear", "equation": "i->i", "side": "left", "mode": "reflect",
           "padding_mode": "zeros", "norm": "backward", "UPLO": "L", "driver": "gelsy"}
_DIM_NAME = re.compile(r"(^|_)(dim|dims|axis|axes|start_dim|end_dim|source|destination)$")


def slot_of(name: str) -> str:
    """What serves the PrivateUse1 key of `name` ("kernel", "backend fallback", "math kernel", ...)."""
    match = re.search(r"^PrivateUse1: .*\[([^\]]+)\]\s*$", torch._C._dispatch_dump_table(name), re.MULTILINE)
    return match.group(1) if match else "none"


def candidates() -> list[str]:
    """Every overload whose kernel for a neuron tensor is PyTorch's composite code, not ours."""
    return sorted(n for n in torch._C._dispatch_get_all_op_names() if slot_of(n) in COMPOSITE)


def overload(name: str) -> torch._ops.OpOverload:
    namespace, _, rest = name.partition("::")
    packet, _, overload_name = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload_name or "default")


class Unsupported(Exception):
    """The schema has an argument the sweep cannot make (Dimname, Storage, Stream, ...)."""


def _value(arg, tensor, device: torch.device):
    kind, name = str(arg.type), arg.name
    if kind.startswith("Optional["):
        if kind == "Optional[Device]":
            return device
        return None
    dim_like = bool(_DIM_NAME.search(name))
    fixed = getattr(arg, "N", None) or 1
    if kind == "Tensor":
        return tensor()
    if kind in ("List[Tensor]", "List[Optional[Tensor]]"):
        return [tensor(), tensor()] if kind == "List[Tensor]" else [tensor()]
    if kind in ("int", "SymInt"):
        return 0 if dim_like else 1
    if kind in ("List[int]", "List[SymInt]"):
        return [0] * fixed if dim_like else [1] * fixed
    if kind == "float":
        return 1e-5 if "eps" in name else 0.5
    if kind == "bool":
        return False
    if kind == "List[bool]":
        return [True] * (getattr(arg, "N", None) or 3)
    if kind == "number":
        return 1
    if kind == "List[number]":
        return [1, 1]
    if kind == "complex":
        return 1j
    if kind == "str":
        return STRINGS.get(name, "")
    if kind == "ScalarType":
        return torch.float32
    if kind == "Layout":
        return torch.strided
    if kind == "Device":
        return device
    if kind == "MemoryFormat":
        return torch.contiguous_format
    raise Unsupported(f"argument {name}: {kind}")


def arguments(op: torch._ops.OpOverload, dtype: torch.dtype, shape: tuple, device="neuron") -> tuple[list, dict]:
    """Positional and keyword arguments for `op` made from its schema; defaulted ones are left out."""
    device = torch.device(device)

    def tensor():
        return torch.ones(shape, dtype=dtype).to(device)

    args, kwargs = [], {}
    for arg in op._schema.arguments:
        if arg.has_default_value():
            continue
        value = _value(arg, tensor, device)
        if arg.kwarg_only:
            kwargs[arg.name] = value
        else:
            args.append(value)
    return args, kwargs


def call(name: str, device: str = "neuron") -> str:
    """Call `name` with each variant of arguments until one returns; "ok", or the last exception."""
    try:
        op = overload(name)
    except (AttributeError, RuntimeError):
        # registered by a module the caller had imported (inductor, c10d functional), not in this process
        return "skipped: not registered in a fresh process"
    outcome = "ok"
    for dtype, shape in TENSOR_VARIANTS:
        try:
            args, kwargs = arguments(op, dtype, shape, device)
        except Unsupported as e:
            return f"skipped: {e}"
        try:
            op(*args, **kwargs)
            if device == "neuron":
                torch.neuron.synchronize()
            return "ok"
        except Exception as e:  # noqa: BLE001 (any Python exception is a fine answer)
            outcome = f"raised {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return outcome


def _worker(conn) -> None:
    import faulthandler
    import warnings

    faulthandler.enable()  # a crash prints the Python stack that led to it on stderr

    import torchneuron

    torchneuron.config.FALLBACK = "cpu"
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    conn.send("ready")
    while (task := conn.recv()) is not None:
        conn.send(call(*task))


class _Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        if not self.conn.poll(STARTUP_TIMEOUT) or self.conn.recv() != "ready":
            raise RuntimeError("crash sweep: a worker did not start")

    def close(self):
        stop_worker(self.conn, self.proc)


def sweep(names: Iterable[str], timeout: float = 60.0, device: str = "neuron") -> Iterator[tuple[str, str]]:
    """(op, outcome) for each op, each called on `device` in a spawned worker; outcome is "ok",
    "raised ...", "skipped ...", "crashed (signal N)", "hung (more than T s)" or "worker exited (code)"."""
    ctx = mp.get_context("spawn")
    worker = None
    try:
        for name in names:
            worker = worker or _Worker(ctx)
            outcome = None
            try:
                worker.conn.send((name, device))
                if worker.conn.poll(timeout):
                    yield name, worker.conn.recv()
                    continue
                worker.proc.kill()
                outcome = f"hung (more than {timeout:g} s)"
            except (EOFError, OSError):
                pass
            worker.proc.join(10)
            code = worker.proc.exitcode
            if outcome is None:
                outcome = f"crashed (signal {-code})" if code is not None and code < 0 else f"worker exited ({code})"
            worker = None
            yield name, outcome
    finally:
        if worker is not None:
            worker.close()


def is_find(outcome: str) -> bool:
    return outcome.startswith(("crashed", "hung", "worker"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated op overloads (aten::foo.bar); default every candidate")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds one op may take")
    parser.add_argument("--verbose", action="store_true", help="print every op's outcome, not only the finds")
    options = parser.parse_args(argv)
    import torchneuron  # noqa: F401 (registers the device, so the dispatch tables show our kernels)

    names = options.only.split(",") if options.only else candidates()
    print(f"{len(names)} ops", file=sys.stderr)
    start, finds = time.monotonic(), {}
    for i, (name, outcome) in enumerate(sweep(names, options.timeout)):
        if is_find(outcome):
            finds[name] = outcome
        elif options.verbose:
            print(f"{name}\t{outcome}", flush=True)
        if i % 100 == 99:
            print(f"{i + 1}/{len(names)} in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    # The same arguments on CPU tell a kernel that reads our memory from arguments no kernel survives.
    for name, on_cpu in sweep(finds, options.timeout, device="cpu"):
        print(f"{name}\t{finds[name]}\ton CPU: {on_cpu}", flush=True)
    print(f"{len(finds)} finds among {len(names)} ops in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return 1 if finds else 0


if __name__ == "__main__":
    sys.exit(main())
