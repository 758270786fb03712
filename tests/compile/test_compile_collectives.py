"""Functional collectives inside compiled graphs, on one rank (the multi-rank patterns are in
test_distributed_compile.py): the graph is rescheduled (collectives issued early, waited for late),
runs as compiled segments around them, and equals the same function run eagerly."""
from __future__ import annotations

import operator

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import torchneuron  # noqa: F401
from torchneuron.compile import segments
from torchneuron.compile.backend import compile_stats

_F = torch.ops._c10d_functional


@pytest.fixture(scope="module")
def group():
    dist.init_process_group("neuron", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_schedule_issues_early_and_waits_late():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(torch.ops.aten.add.Tensor, (x, 1))
    layer_norm = graph.call_function(torch.ops.aten.native_layer_norm.default, (a, [4], None, None, 1e-5))
    normed = graph.call_function(operator.getitem, (layer_norm, 0))
    mean = graph.call_function(operator.getitem, (layer_norm, 1))
    b = graph.call_function(torch.ops.aten.mul.Tensor, (x, 2))
    start = graph.call_function(_F.all_reduce.default, (normed, "sum", "0"))
    done = graph.call_function(_F.wait_tensor.default, (start,))
    c = graph.call_function(torch.ops.aten.relu.default, (b,))
    d = graph.call_function(torch.ops.aten.add.Tensor, (done, c))
    graph.output((d, mean))
    segments.schedule(graph)
    order = [n for n in graph.nodes if n.op == "call_function"]
    # issued right after its input (but not between layer_norm and its getitems), waited for right
    # before its only use: the multiply and relu run while the bytes move
    assert order == [a, layer_norm, normed, mean, start, b, c, done, d]


def _collectives(x, group):
    y = funcol.all_reduce(x * 2, "sum", group)
    gathered = funcol.all_gather_tensor(x + 1, 0, group)
    scattered = funcol.reduce_scatter_tensor(x.sin(), "sum", 0, group)
    swapped = funcol.all_to_all_single(x.cos(), None, None, group)
    sent = funcol.broadcast(x - 1, 0, group)
    a, b = funcol.all_reduce_coalesced([x.exp(), x.tanh()], "max", group)
    return y + x.sin(), gathered, scattered, swapped, sent, a, b


def test_compiled_collectives_equal_eager(group):
    x = torch.randn(4, 3)
    expected = _collectives(x.to("neuron"), group)
    before = compile_stats()
    compiled = torch.compile(_collectives, backend="neuron", fullgraph=True)
    for _ in range(2):
        actual = compiled(x.to("neuron"), group)
        for a, e in zip(actual, expected, strict=True):
            assert a.device.type == "neuron"
            torch.testing.assert_close(a.cpu(), e.cpu())
    after = compile_stats()
    assert after.get("eager_graphs", 0) == before.get("eager_graphs", 0)
    assert after["segmented_graphs"] == before.get("segmented_graphs", 0) + 1
    assert after["graph_collectives"] == before.get("graph_collectives", 0) + 6
    # the worker has run them all; an eager collective after them works and sees its own input
    t = torch.full((3,), 2.0, device="neuron")
    dist.all_reduce(t, group=group)
    assert t.cpu().tolist() == [2.0, 2.0, 2.0]


def test_compiled_collectives_backward(group):
    # the gradient of a collective in the backward graph: all_gather's is a reduce-scatter
    weight = torch.randn(3, 3)

    def loss(w, x):
        gathered = funcol.all_gather_tensor_autograd(x @ w, 0, group)
        return (gathered.tanh() * 2).sum()

    w = weight.to("neuron").requires_grad_()
    x = torch.randn(5, 3)
    torch.compile(loss, backend="neuron")(w, x.to("neuron")).backward()
    reference = weight.clone().requires_grad_()
    ((x @ reference).tanh() * 2).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), reference.grad)


def _three_gathers(x, group):
    a = funcol.all_gather_tensor(x + 1, 0, group)
    b = funcol.all_gather_tensor(x * 3, 0, group)
    c = funcol.all_gather_tensor(x.exp(), 0, group)
    return a.sin() + b, c * 2


@pytest.mark.parametrize("cap, buckets", [(16 << 20, 1), (1, 3)])
def test_collectives_issued_together_share_one_transfer(group, monkeypatch, cap, buckets):
    monkeypatch.setattr(segments, "BUCKET_BYTES", cap)
    torch._dynamo.reset()
    x = torch.randn(4, 3)
    before = compile_stats()
    actual = torch.compile(_three_gathers, backend="neuron", fullgraph=True)(x.to("neuron"), group)
    expected = ((x + 1).sin() + x * 3, x.exp() * 2)  # (one rank: a gather is the identity)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a.cpu(), e)
    after = compile_stats()
    assert after["graph_collectives"] - before.get("graph_collectives", 0) == 3
    assert after["collective_buckets"] - before.get("collective_buckets", 0) == buckets
