"""A graph with collectives in it, run as compiled segments with the collectives between them.

The graph is first rescheduled: each collective is issued right after its inputs are computed and
waited for right before its first use, so the ops in between (everything that does not depend on
the collective) run on the device while the transport moves the bytes. Collectives issued close
together then share buckets, one transfer each (a SimpleFSDP forward's all-gathers are one). The
ops between two collective steps become one segment, compiled like any graph
(`backend.compile_graph`): a tensor-parallel MLP's forward is two executables around one all-reduce.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from ..runtime import deferred
from . import collectives


def _is_part(node: torch.fx.Node) -> bool:
    """A getitem of a coalesced collective's results."""
    return (node.op == "call_function" and node.target is operator.getitem
            and isinstance(node.args[0], torch.fx.Node) and collectives.is_start(node.args[0]))


def schedule(graph: torch.fx.Graph) -> None:
    """Move each collective start up to just after its last input, and each wait down to just
    before its first user (the graph is functional: no op reads a collective's input through an
    alias written in between)."""
    last_placeholder = None
    for node in graph.nodes:
        if node.op == "placeholder":
            last_placeholder = node
    for node in [n for n in graph.nodes if collectives.is_start(n)]:
        order = {n: i for i, n in enumerate(graph.nodes)}
        anchors = [n for n in node.all_input_nodes] + ([last_placeholder] if last_placeholder else [])
        if not anchors:
            continue
        anchor = max(anchors, key=order.__getitem__)
        # never between a multi-output op and its getitems: a segment returns tensors, not tuples
        while (anchor.next.op == "call_function" and anchor.next.target is operator.getitem
               and not collectives.is_start(anchor.next.args[0]) and order[anchor.next.args[0]] <= order[anchor]):
            anchor = anchor.next
        anchor.append(node)
    for node in reversed([n for n in graph.nodes if collectives.is_wait(n)]):
        order = {n: i for i, n in enumerate(graph.nodes)}
        if node.users:
            min(node.users, key=order.__getitem__).prepend(node)


# A bucket's size cap: collectives issued close together share one transfer up to this many bytes
# (each transfer costs a device read, a host round trip and a check of the ranks' agreement).
BUCKET_BYTES = 16 << 20


def _source(wait: torch.fx.Node) -> torch.fx.Node:
    """The start a wait is for."""
    n = wait.args[0]
    return n.args[0] if _is_part(n) else n


def bucket(graph: torch.fx.Graph, cap: int | None = None) -> dict[torch.fx.Node, int]:
    """Group scheduled collectives into buckets, each issued as one transfer; returns each start's
    bucket. A bucket takes starts of the same kind, arguments and dtype until it holds `cap` bytes or
    one of its results is waited for. Its members move down to the last one (the bucket is issued
    once all its inputs exist), and all its waits up to the first (its results arrive together)."""
    cap = BUCKET_BYTES if cap is None else cap
    bucket_of: dict[torch.fx.Node, int] = {}
    members: list[list[torch.fx.Node]] = []
    open_buckets: dict = {}  # key -> (bucket, bytes so far)
    for node in list(graph.nodes):
        if collectives.is_start(node):
            key = collectives.bucket_key(node)
            index, size = open_buckets.get(key, (len(members), 0)) if key is not None else (len(members), 0)
            if index == len(members):
                members.append([])
            members[index].append(node)
            bucket_of[node] = index
            size += collectives.bytes_of(node)
            if key is not None and size < cap:
                open_buckets[key] = (index, size)
            else:
                open_buckets.pop(key, None)
        elif collectives.is_wait(node) and _source(node) in bucket_of:
            index = bucket_of[_source(node)]
            open_buckets = {k: v for k, v in open_buckets.items() if v[0] != index}
    waits: dict[int, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        if collectives.is_wait(node) and _source(node) in bucket_of:
            waits.setdefault(bucket_of[_source(node)], []).append(node)
    for index, nodes in enumerate(members):
        if len(nodes) < 2:
            continue
        for n in nodes[:-1]:
            nodes[-1].prepend(n)
        found = waits.get(index, [])
        for w in found[1:]:
            found[0].prepend(w)
    return bucket_of


class _Segment:
    """Ops between collectives, as one compiled graph: reads `inputs` from the environment and
    writes `outputs` (the values used after it)."""

    def __init__(self, run, inputs, outputs):
        self.run, self.inputs, self.outputs = run, inputs, outputs

    def reads(self):
        return self.inputs

    def __call__(self, env):
        results = self.run(*[env[n] for n in self.inputs])
        env.update(zip(self.outputs, results))


class _Collective:
    """A bucket of starts (issued as one transfer), a part of a coalesced start, or a wait."""

    def __init__(self, node):
        self.node = node
        self.bucket = [node]

    def reads(self):
        return [a for n in self.bucket for a in n.all_input_nodes]

    def __call__(self, env):
        node = self.node
        if collectives.is_start(node):
            args = [torch.fx.map_arg(n.args, env.__getitem__) for n in self.bucket]
            env.update(zip(self.bucket, collectives.start(node.target, args)))
        elif collectives.is_wait(node):
            env[node] = collectives.wait(env[node.args[0]])
        else:
            env[node] = env[node.args[0]][node.args[1]]


def _segment_module(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node]):
    """`nodes` as a graph module of their own: (module, the nodes it reads, the nodes it returns)."""
    inside = set(nodes)
    reads = []
    for node in nodes:
        for a in node.all_input_nodes:
            if a not in inside and a not in reads and a.op != "get_attr":
                reads.append(a)
    graph = torch.fx.Graph()
    env = {}
    for a in reads:
        env[a] = graph.placeholder(a.name)
        env[a].meta = dict(a.meta)

    def arg(a):
        if a not in env:  # a constant made outside the segment: the segment gets its own reference
            env[a] = graph.node_copy(a, arg)
        return env[a]

    for node in nodes:
        env[node] = graph.node_copy(node, arg)
    returns = [n for n in nodes if any(u not in inside for u in n.users)]
    graph.output(tuple(env[n] for n in returns))
    return torch.fx.GraphModule(gm, graph), reads, returns


class SegmentedGraph:
    """Runs a graph with collectives: `compile_segment(module, name)` compiles each segment."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, compile_segment):
        schedule(gm.graph)
        bucket_of = bucket(gm.graph)
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        self.steps: list = []
        pending: list[torch.fx.Node] = []

        def close():
            if pending:
                module, reads, returns = _segment_module(gm, pending)
                run = compile_segment(module, f"{name}/{len(self.steps)}")
                self.steps.append(_Segment(run, reads, returns))
                pending.clear()

        for node in gm.graph.nodes:
            if node.op in ("placeholder", "output"):
                continue
            if collectives.is_start(node) or collectives.is_wait(node) or _is_part(node):
                close()
                previous = self.steps[-1] if self.steps else None
                if (collectives.is_start(node) and isinstance(previous, _Collective)
                        and bucket_of.get(previous.node, -1) == bucket_of[node]):
                    previous.bucket.append(node)  # the same bucket: one transfer
                else:
                    self.steps.append(_Collective(node))
            else:
                pending.append(node)
        close()
        # What each step is the last to read: released after it, so a segment's intermediates do not
        # live until the end of the graph.
        kept = set(self.output_nodes())
        last = {}
        for index, step in enumerate(self.steps):
            for n in step.reads():
                last[n] = index
        self.release = [[] for _ in self.steps]
        for n, index in last.items():
            if n not in kept:
                self.release[index].append(n)
        self.segments = sum(isinstance(s, _Segment) for s in self.steps)
        self.collectives = sum(len(s.bucket) for s in self.steps if isinstance(s, _Collective)
                               and collectives.is_start(s.node))
        self.buckets = sum(isinstance(s, _Collective) and collectives.is_start(s.node) for s in self.steps)

    def output_nodes(self) -> list[torch.fx.Node]:
        found = []
        torch.fx.map_arg(self.output, found.append)
        return found

    def __call__(self, *inputs):
        deferred.flush("compiled graph")
        env = dict(zip(self.placeholders, inputs))
        del inputs  # (the environment holds each input only until its last reader)
        for step, release in zip(self.steps, self.release):
            step(env)
            for n in release:
                del env[n]
        return [collectives.settled(v) for v in torch.fx.map_arg(self.output, env.__getitem__)]
