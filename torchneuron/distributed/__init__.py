"""torch.distributed on neuron: the c10d backend "neuron".

    torchrun --nproc-per-node=2 train.py

    import torch.distributed as dist, torchneuron.distributed as tnd
    device = tnd.init()                       # neuron:LOCAL_RANK, process group "neuron"
    dist.all_reduce(torch.ones(4, device=device))

Importing torchneuron registers the backend, so `init_process_group(backend="neuron")` works,
and `init_process_group()` picks it for the neuron device (`Backend.default_device_backend_map`).
The group also takes CPU tensors (passed straight to the transport), so object collectives,
DDP's metadata checks and CPU barriers work on it as well.

Processes: one per NeuronCore, started with torchrun or torch.multiprocessing's spawn, never
fork (JAX, and so the device, must not be initialised in a parent whose children use it). Each
process sees every core and uses `neuron:LOCAL_RANK`, its current device from the start (so
`torch.device("neuron")` is the rank's own core, as on torch_neuronx); on the CPU platform set
TORCHNEURON_CORES >= nproc-per-node (default 2).

Transport and its cost: the process group (`process_group.NeuronProcessGroup`) stages tensors
through host memory and moves them with gloo over TCP (`transport.GlooTransport`, on the same
store). A collective costs one device-to-host and one host-to-device transfer on top of gloo,
and runs synchronously: `async_op=True` works but does not overlap with compute. Collectives inside
compiled graphs are issued to a worker thread per group instead (`in_flight`), bucketed, and waited
for only where their results are used, so they overlap the graph's compute (docs/COMPILE.md). The transport
is one small class of CPU-tensor collectives so that a device-native one (PJRT collectives
between NeuronCores, no host round trip) can replace it without touching the process group.

Faults: a dead or stalled peer makes gloo raise (connection closed, or the process group
timeout) so the other ranks fail with an error instead of hanging; gloo also refuses
collectives whose sizes disagree across ranks.
"""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from .process_group import NeuronProcessGroup
from .transport import GlooTransport

__all__ = ["GlooTransport", "NeuronProcessGroup", "init", "register", "start_on_local_rank"]


def _create(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> NeuronProcessGroup:
    return NeuronProcessGroup(store, rank, size, timeout)


def register() -> None:
    """Register the c10d backend "neuron", the default for neuron tensors; it also serves CPU."""
    if "neuron" not in dist.Backend.backend_list:
        dist.Backend.register_backend("neuron", _create, devices=["neuron", "cpu"])


def start_on_local_rank() -> None:
    """Under a launcher (torchrun's LOCAL_RANK), make neuron:LOCAL_RANK the process's current device.

    Each process sees every core, so without this every rank's `torch.device("neuron")` and
    `torch.neuron.current_device()` would be core 0. Libraries written for torch_neuronx, which
    shows each rank only its own core, rely on the current device being the rank's (accelerate
    places the model on `torch.neuron.current_device()`). A LOCAL_RANK beyond the cores is left
    to `init()` (or the user) to report."""
    local_rank = os.environ.get("LOCAL_RANK", "")
    if local_rank.isdigit() and 0 < int(local_rank) < torch.neuron.device_count():
        torch.neuron.set_device(int(local_rank))


def init(timeout: datetime.timedelta | None = None) -> torch.device:
    """Start the process group from torchrun's environment on neuron:LOCAL_RANK; return the device."""
    index = int(os.environ.get("LOCAL_RANK", "0"))
    if index >= torch.neuron.device_count():
        raise RuntimeError(f"LOCAL_RANK {index} but only {torch.neuron.device_count()} NeuronCores; "
                           "on the cpu platform set TORCHNEURON_CORES >= nproc-per-node")
    torch.neuron.set_device(index)
    device = torch.device("neuron", index)
    if not dist.is_initialized():
        dist.init_process_group(backend="neuron", **({"timeout": timeout} if timeout else {}))
    return device
