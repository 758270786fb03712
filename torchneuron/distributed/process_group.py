"""`NeuronProcessGroup`: c10d collectives on neuron tensors, staged through host memory.

Each collective copies its neuron inputs to host (one transfer; several tensors are concatenated
on the device first), runs the transport on CPU tensors, and copies results back into the neuron
tensors in place (again one transfer, then device-side copies into each destination). Outputs
that are only written (all-gather, receive, reduce-scatter destinations) are never read from the
device. CPU tensors pass through unstaged, so the same group serves CPU collectives too.

Before each collective the ranks exchange a 3-integer signature (collective, dtype, element
count) so that a mismatch raises a clear error on every rank: gloo itself aborts the process on
mismatched sizes. It costs one small extra round trip per collective; `check_metadata = False`
on a group skips it.

Collectives run to completion before they return; the Work they hand back is already done, so
`async_op=True` is accepted but does not overlap communication with compute. Compiled graphs issue
their functional collectives through `in_flight` instead, which does overlap; every collective
called here first waits for those, so all of a group's collectives run in program order.
"""
from __future__ import annotations

import functools
import zlib

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from . import in_flight
from .in_flight import Queue
from .transport import GlooTransport

Op = dist.ReduceOp.RedOpType


def _on_host(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.is_contiguous()


def _coalescible(tensors: list[torch.Tensor]) -> bool:
    first = tensors[0]
    return len(tensors) > 1 and all(t.device == first.device and t.dtype == first.dtype for t in tensors)


def _stage(tensors: list[torch.Tensor]) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """Contiguous host copies of `tensors`: (flat, views). When the tensors share a device and
    dtype, `flat` is one host buffer holding them all and `views` alias it; else `flat` is None."""
    if _coalescible(tensors):
        flat = torch.cat([t.detach().reshape(-1) for t in tensors]).cpu()
        return flat, [piece.view(t.shape) for piece, t in zip(flat.split([t.numel() for t in tensors]), tensors)]
    return None, [t if _on_host(t) else t.detach().cpu().contiguous() for t in tensors]


def _host_like(t: torch.Tensor) -> torch.Tensor:
    """A host buffer for output `t`, uninitialised: outputs need not be read from the device."""
    return t if _on_host(t) else torch.empty(t.shape, dtype=t.dtype)


def _write_back(dsts: list[torch.Tensor], hosts: list[torch.Tensor]) -> None:
    """Copy host results into the destinations, in one host-to-device transfer when possible."""
    pairs = [(d, h) for d, h in zip(dsts, hosts) if d is not h]
    if not pairs:
        return
    dsts, hosts = [d for d, _ in pairs], [h for _, h in pairs]
    if _coalescible(dsts) and dsts[0].device.type != "cpu":
        flat = torch.cat([h.reshape(-1) for h in hosts]).to(dsts[0].device)
        for d, piece in zip(dsts, flat.split([d.numel() for d in dsts])):
            d.copy_(piece.view(d.shape))
        return
    for d, h in pairs:
        d.copy_(h)


def _code(name: str) -> int:
    """A name as an integer that is the same in every process (str hashes are salted)."""
    return zlib.crc32(name.encode())


_DTYPE_NAMES = {_code(str(d)): str(d) for d in vars(torch).values() if isinstance(d, torch.dtype)}
ANY = -1  # a signature field that need not match


def _in_order(collective):
    """A collective that runs after the group's issued (in-flight) collectives. Never traced: a
    compiled DDP module calls the group from C++ (bucket rebuilds) while Dynamo is tracing, and the
    group's state is opaque to Dynamo (`_never_traced` disables Dynamo on it)."""
    @functools.wraps(collective)
    def run(self, *args, **kwargs):
        self.in_flight.drain()
        return collective(self, *args, **kwargs)
    run.in_order = True
    return run


def _never_traced(cls) -> None:
    """torch.compiler.disable on each `_in_order` collective of `cls`, once, when its first group is
    made: the decorator imports Dynamo (1-2 s), and `import torch` loads torchneuron, so applied at
    import it would slow every program; no collective runs before a group exists."""
    if "_dynamo_disabled" in vars(cls):
        return
    for name, method in list(vars(cls).items()):
        if getattr(method, "in_order", False):
            setattr(cls, name, torch.compiler.disable(method, recursive=True))
    cls._dynamo_disabled = True


def _done(result) -> dist.Work:
    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


class NeuronProcessGroup(dist.ProcessGroup):
    """A process group whose collectives accept neuron (and CPU) tensors."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout):
        super().__init__(rank, size)
        _never_traced(NeuronProcessGroup)
        self.transport = GlooTransport(store, rank, size, timeout)
        self._name = self._desc = ""
        self.check_metadata = True
        self.in_flight = Queue(self)  # collectives issued by compiled graphs, run on a worker

    def issue_collective(self, name: str, inputs: list[torch.Tensor], *arguments):
        """Start collective `name` (`in_flight.COLLECTIVES`) of neuron tensors `inputs` without
        waiting; returns an `in_flight.Issued`, whose `wait()` gives the results. For compiled
        graphs (torchneuron.compile.collectives)."""
        return in_flight.issue(self, name, inputs, *arguments)

    def getBackendName(self) -> str:
        return "neuron"

    # c10d keeps a group's name on its C++ backends, which a Python group has none of.
    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return self._name

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def getGroupDesc(self) -> str:
        return self._desc

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc

    def _agree(self, collective: str, dtype: torch.dtype, numel: int = ANY) -> None:
        """Raise on every rank unless all ranks call `collective` with the same dtype and size."""
        if not self.check_metadata or self.size() == 1:
            return
        mine = torch.tensor([_code(collective), _code(str(dtype)), numel], dtype=torch.int64)
        everyone = torch.empty(self.size(), 3, dtype=torch.int64)
        self.transport.allgather_into(everyone.view(-1), mine)
        if torch.equal(everyone, mine.expand_as(everyone)):
            return
        calls = "; ".join(f"rank {r}: {collective if c == mine[0] else 'another collective'} "
                          f"{_DTYPE_NAMES.get(d, '?')}" + (f" x{n}" if n != ANY else "")
                          for r, (c, d, n) in enumerate(everyone.tolist()))
        raise RuntimeError(f"neuron process group {self._name!r}: ranks disagree on {collective}: {calls}")

    # ----------------------------------------------------------------- reductions
    def _reduce_on_host(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor], op: dist.ReduceOp,
                        run) -> None:
        """Run `run(transport_op)` on host buffers, turning AVG and PREMUL_SUM into a SUM with a
        scale of the inputs or outputs (transports only know SUM, MIN, MAX, PRODUCT; gloo has no AVG)."""
        kind = op.op if isinstance(op, dist.ReduceOp) else op
        if kind == Op.AVG and not all(h.dtype.is_floating_point or h.dtype.is_complex for h in inputs):
            raise ValueError("ReduceOp.AVG needs floating point tensors")
        if kind == Op.PREMUL_SUM:
            for h in inputs:
                h.mul_(float(op.factor))
        run(Op.SUM if kind in (Op.AVG, Op.PREMUL_SUM) else kind)
        if kind == Op.AVG:
            for h in outputs:
                h.div_(self.size())

    @_in_order
    @torch.no_grad()
    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else tensors
        self._agree("allreduce", tensors[0].dtype, tensors[0].numel())
        _, hosts = _stage(tensors[:1])
        self._reduce_on_host(hosts, hosts, opts.reduceOp, lambda op: self.transport.allreduce(hosts, op))
        _write_back(tensors, hosts * len(tensors))
        return _done(tensors)

    @_in_order
    @torch.no_grad()
    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        if len({t.dtype for t in tensors}) > 1:
            raise TypeError("allreduce_coalesced needs tensors of one dtype, got "
                            f"{sorted({str(t.dtype) for t in tensors})}")
        self._agree("allreduce_coalesced", tensors[0].dtype, sum(t.numel() for t in tensors))
        flat, hosts = _stage(tensors)
        buffers = hosts if flat is None else [flat]
        self._reduce_on_host(buffers, buffers, opts.reduceOp, lambda op: self.transport.allreduce(buffers, op))
        _write_back(tensors, hosts)
        return _done(tensors)

    @_in_order
    @torch.no_grad()
    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        self._agree("reduce", tensors[0].dtype, tensors[0].numel())
        _, hosts = _stage(tensors)
        self._reduce_on_host(hosts, hosts, opts.reduceOp,
                             lambda op: self.transport.reduce(hosts[0], opts.rootRank, op))
        if self.rank() == opts.rootRank:
            _write_back(tensors, hosts)
        return _done(tensors)

    @_in_order
    @torch.no_grad()
    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        self._agree("reduce_scatter", input.dtype, input.numel())
        _, (host_in,) = _stage([input])
        host_out = _host_like(output)
        self._reduce_on_host([host_in], [host_out], opts.reduceOp,
                             lambda op: self.transport.reduce_scatter_into(host_out.view(-1), host_in.view(-1), op))
        _write_back([output], [host_out])
        return _done([output])

    @_in_order
    @torch.no_grad()
    def reduce_scatter(self, outputs, input_lists, opts=None):
        chunks = input_lists[0]
        if len({c.shape for c in chunks}) > 1:
            raise ValueError("reduce_scatter needs input chunks of one shape")
        flat = torch.cat([c.detach().reshape(-1) for c in chunks])
        return self.reduce_scatter_single(outputs[0], flat, opts)

    @_in_order
    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            self.reduce_scatter_single(output, input, opts)
        return _done(outputs)

    # ------------------------------------------------------------------ data movement
    @_in_order
    @torch.no_grad()
    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        self._agree("broadcast", tensors[0].dtype, tensors[0].numel())
        root = self.rank() == opts.rootRank
        hosts = _stage(tensors)[1] if root else [_host_like(t) for t in tensors]
        for h in hosts:
            self.transport.broadcast(h, opts.rootRank)
        if not root:
            _write_back(tensors, hosts)
        return _done(tensors)

    @_in_order
    @torch.no_grad()
    def all_gather_single(self, output, input, opts=None):
        self._agree("all_gather", input.dtype, input.numel())
        _, (host_in,) = _stage([input])
        host_out = _host_like(output)
        self.transport.allgather_into(host_out.view(-1), host_in.view(-1))
        _write_back([output], [host_out])
        return _done([output])

    @_in_order
    @torch.no_grad()
    def allgather(self, output_lists, inputs, opts=None):
        outputs = output_lists[0]
        if any(o.shape != inputs[0].shape for o in outputs):
            raise ValueError(f"allgather outputs must all have the input's shape {tuple(inputs[0].shape)}")
        self._agree("all_gather", inputs[0].dtype, inputs[0].numel())
        _, (host_in,) = _stage(inputs)
        host_out = torch.empty((len(outputs), *host_in.shape), dtype=host_in.dtype)
        self.transport.allgather_into(host_out.view(-1), host_in.view(-1))
        _write_back(outputs, list(host_out.unbind(0)))
        return _done(output_lists)

    @_in_order
    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            self.all_gather_single(output, input, opts)
        return _done(outputs)

    @_in_order
    @torch.no_grad()
    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        self._agree("all_to_all", input.dtype)
        _, (host_in,) = _stage([input])
        host_out = _host_like(output)
        self.transport.alltoall(host_out, host_in, list(output_splits), list(input_splits))
        _write_back([output], [host_out])
        return _done([output])

    @_in_order
    @torch.no_grad()
    def alltoall(self, outputs, inputs, opts=None):
        self._agree("all_to_all", inputs[0].dtype)
        flat, hosts = _stage(inputs)
        flat_in = flat if flat is not None else torch.cat([h.reshape(-1) for h in hosts])
        host_out = torch.empty(sum(o.numel() for o in outputs), dtype=outputs[0].dtype)
        self.transport.alltoall(host_out, flat_in, [o.numel() for o in outputs], [i.numel() for i in inputs])
        pieces = host_out.split([o.numel() for o in outputs])
        _write_back(outputs, [p.view(o.shape) for p, o in zip(pieces, outputs)])
        return _done(outputs)

    @_in_order
    @torch.no_grad()
    def gather(self, output_lists, inputs, opts=None):
        opts = opts or dist.GatherOptions()
        self._agree("gather", inputs[0].dtype, inputs[0].numel())
        root = self.rank() == opts.rootRank
        _, (host_in,) = _stage(inputs)
        outputs = output_lists[0] if root else []
        host_outs = [_host_like(o) for o in outputs]
        self.transport.gather(host_outs, host_in, opts.rootRank)
        _write_back(outputs, host_outs)
        return _done(output_lists)

    @_in_order
    @torch.no_grad()
    def scatter(self, outputs, input_lists, opts=None):
        opts = opts or dist.ScatterOptions()
        self._agree("scatter", outputs[0].dtype, outputs[0].numel())
        root = self.rank() == opts.rootRank
        host_ins = _stage(input_lists[0])[1] if root else []
        host_out = _host_like(outputs[0])
        self.transport.scatter(host_out, host_ins, opts.rootRank)
        _write_back(outputs[:1], [host_out])
        return _done(outputs)

    @_in_order
    @torch.no_grad()
    def send(self, tensors, dst, tag=0):
        for h in _stage(tensors)[1]:
            self.transport.send(h, dst, tag)
        return _done(tensors)

    @_in_order
    @torch.no_grad()
    def recv(self, tensors, src, tag=0):
        hosts = [_host_like(t) for t in tensors]
        for h in hosts:
            self.transport.recv(h, src, tag)
        _write_back(tensors, hosts)
        return _done(tensors)

    @_in_order
    def barrier(self, opts=None):
        self.transport.barrier()
        return _done([])

    # The pre-2.13 names, still used by some callers.
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    alltoall_base = all_to_all_single
