"""Functional collectives (`torch.ops._c10d_functional`) in compiled graphs.

Tensor parallel, DTensor redistribution and SimpleFSDP trace their communication as functional
collectives: a start op that returns the result-to-be (`all_reduce`, `all_gather_into_tensor`, ...)
and a `wait_tensor` before its first use. Here is which nodes those are and how a segmented graph
(`segments.py`) runs them: on a group with `issue_collective` (the neuron process group) a start is
issued to the group's worker (`torchneuron.distributed.in_flight`) and returns at once; on any other
group it runs the op itself.
"""
from __future__ import annotations

import torch

from ..lowering import Facet

_F = torch.ops._c10d_functional


def _one(node_args):
    """(inputs, arguments) of a collective on one tensor: its group name is the last argument."""
    return [node_args[0]], tuple(node_args[1:-1])


def _many(node_args):
    return list(node_args[0]), tuple(node_args[1:-1])


COLLECTIVES = Facet("collective")  # start op -> how it is issued (its record's, lowering/collectives.py)
WAIT = _F.wait_tensor.default


def is_start(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in COLLECTIVES


def is_wait(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is WAIT


def in_graph(gm: torch.fx.GraphModule) -> bool:
    return any(is_start(n) for n in gm.graph.nodes)


class _Part:
    """One result of a collective in flight (a coalesced one has several)."""

    __slots__ = ("index", "issued")

    def __init__(self, issued, index: int):
        self.issued, self.index = issued, index

    def wait(self) -> torch.Tensor:
        return self.issued.wait()[self.index]


class _Ran:
    """The result of a collective that ran as its own op (a group other than neuron's)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def wait(self) -> torch.Tensor:
        return _F.wait_tensor(self.value)


# The collectives whose members can share one transfer (a bucket of all-gathers is one all-gather).
def bucket_key(node: torch.fx.Node):
    """What collectives must share to go in one bucket (op, its arguments and group, dtype); None
    for one that goes alone."""
    value = node.meta.get("val")
    start = COLLECTIVES.get(node.target)
    if start is None or not start.mergeable or not isinstance(value, torch.Tensor):
        return None
    return node.target, tuple(node.args[1:]), value.dtype


def bytes_of(node: torch.fx.Node) -> int:
    value = node.meta.get("val")
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def start(target, args_list) -> list:
    """Issue collective `target` for each argument tuple of `args_list` (a bucket: one group, the
    same arguments) as one transfer; returns per member what `wait` takes (a list of them for a
    coalesced form)."""
    start = COLLECTIVES[target]
    name, split, many = start.name, _many if start.coalesced else _one, start.coalesced
    group = group_of(args_list[0][-1])
    members = [split(args) for args in args_list]
    inputs = [t for member_inputs, _ in members for t in member_inputs]
    # A group that can issue without waiting says so with `issue_collective` (the neuron process
    # group: torchneuron.distributed.in_flight); compile does not import the distributed layer.
    issue_collective = getattr(group, "issue_collective", None)
    if issue_collective is None or any(t.device.type != "neuron" for t in inputs):
        results = [target(*args) for args in args_list]
        return [[_Ran(r) for r in result] if many else _Ran(result) for result in results]
    issued = issue_collective(name, inputs, *members[0][1])
    out, index = [], 0
    for member_inputs, _ in members:
        parts = [_Part(issued, index + i) for i in range(len(member_inputs))]
        index += len(member_inputs)
        out.append(parts if many else parts[0])
    return out


def wait(pending) -> torch.Tensor:
    if isinstance(pending, torch.Tensor):  # issued outside the graph (an input still in flight)
        return _F.wait_tensor(pending)
    return pending.wait()


def settled(value):
    """`value` as a graph may return it: a collective still in flight (a graph's output that its
    backward waits on, as activation checkpointing saves it) waited for, so AOTAutograd only ever
    receives tensors; the later `wait_tensor` of a tensor returns it."""
    if isinstance(value, (_Part, _Ran)):
        return value.wait()
    if isinstance(value, list) and any(isinstance(v, (_Part, _Ran)) for v in value):
        return [settled(v) for v in value]
    return value


def group_of(name_or_group):
    if isinstance(name_or_group, str):
        return torch._C._distributed_c10d._resolve_process_group(name_or_group)
    return name_or_group
