"""The one interface through which neuron collectives move bytes between processes.

Every method takes contiguous CPU tensors, runs to completion (or raises), and writes results in
place. Reductions are only SUM, MIN, MAX and PRODUCT; the process group turns AVG and PREMUL_SUM
into SUM plus a scale on the host copy, so a transport never sees them. A device-native
transport (PJRT collectives between NeuronCores) replaces `GlooTransport` by implementing the
same methods on device buffers.
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist


def _opts(cls, **fields):
    """A c10d options struct (pybind structs take no constructor arguments)."""
    opts = cls()
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


class GlooTransport:
    """Collectives on CPU tensors over gloo (TCP), on the process group's store."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta):
        self.gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self.timeout = timeout

    def _wait(self, work) -> None:
        work.wait(self.timeout)

    def allreduce(self, tensors: list[torch.Tensor], op: dist.ReduceOp.RedOpType) -> None:
        self._wait(self.gloo.allreduce(tensors, _opts(dist.AllreduceOptions, reduceOp=op)))

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self._wait(self.gloo.broadcast([tensor], _opts(dist.BroadcastOptions, rootRank=src)))

    def reduce(self, tensor: torch.Tensor, dst: int, op: dist.ReduceOp.RedOpType) -> None:
        self._wait(self.gloo.reduce([tensor], _opts(dist.ReduceOptions, rootRank=dst, reduceOp=op)))

    def allgather_into(self, output: torch.Tensor, input: torch.Tensor) -> None:
        """output is size copies of input, concatenated along dim 0."""
        self._wait(self.gloo._allgather_base(output, input))

    def reduce_scatter_into(self, output: torch.Tensor, input: torch.Tensor,
                            op: dist.ReduceOp.RedOpType) -> None:
        """input is size chunks along dim 0; this rank gets the reduction of its chunk."""
        opts = _opts(dist.ReduceScatterOptions, reduceOp=op)
        self._wait(self.gloo._reduce_scatter_base(output, input, opts))

    def alltoall(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                 input_splits: list[int]) -> None:
        self._wait(self.gloo.alltoall_base(output, input, output_splits, input_splits,
                                           _opts(dist.AllToAllOptions)))

    def gather(self, outputs: list[torch.Tensor], input: torch.Tensor, dst: int) -> None:
        opts = _opts(dist.GatherOptions, rootRank=dst)
        self._wait(self.gloo.gather([outputs] if outputs else [], [input], opts))

    def scatter(self, output: torch.Tensor, inputs: list[torch.Tensor], src: int) -> None:
        opts = _opts(dist.ScatterOptions, rootRank=src)
        self._wait(self.gloo.scatter([output], [inputs] if inputs else [], opts))

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        self._wait(self.gloo.send([tensor], dst, tag))

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> None:
        self._wait(self.gloo.recv([tensor], src, tag))

    def barrier(self) -> None:
        self._wait(self.gloo.barrier())
