"""torch.compile over distributed training on neuron: functional collectives inside compiled graphs
(tensor and sequence parallel, SimpleFSDP), FSDP2 around compiled blocks with a compiled optimizer
step, DDP with a compiled model, and a dead rank inside a compiled step. Each pattern runs on 2
spawned ranks against the same model on CPU, and shows no graph run op by op (`eager_graphs`)."""
from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from tests.distributed.test_distributed import ROOT, _close, _full_batch_reference, slow, spawn
from torchneuron.compile.backend import compile_stats
from torchneuron.testing.models import MODELS, NormMLP, batches, loss_of
from torchneuron.testing.processes import free_port, run_torchrun

pytestmark = slow  # spawned ranks compiling: about 20 s each


def _no_eager_graphs(segmented: bool = True) -> None:
    stats = compile_stats()
    assert stats.get("eager_graphs", 0) == 0, stats
    if segmented:
        assert stats.get("segmented_graphs", 0) >= 1 and stats.get("graph_collectives", 0) >= 1, stats


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t


def _parallel_step(plan, shard_input: bool, rank: int, device, wrap=lambda block: block) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    mesh = init_device_mesh("neuron", (dist.get_world_size(),))
    torch.manual_seed(0)
    reference, block = NormMLP(), NormMLP()
    block.load_state_dict(reference.state_dict())
    block = torch.compile(wrap(parallelize_module(block.to(device), mesh, plan)), backend="neuron")
    compiles = None
    for step in range(3):
        x = torch.randn(2, 6, 8)
        local = x.chunk(2, dim=1)[rank] if shard_input else x
        out = block(local.to(device))
        out.sum().backward()
        ref = reference(x)
        ref.sum().backward()
        expected = ref.chunk(2, dim=1)[rank] if shard_input else ref
        grads = [_full(p.grad).cpu() for p in block.parameters()]
        _close([out.detach().cpu(), *grads], [expected.detach(), *[p.grad for p in reference.parameters()]])
        if step == 0:
            compiles = compile_stats()["compiles"]
    assert compile_stats()["compiles"] == compiles, "recompiled after the first step"


def _tensor_parallel_worker(rank: int, device) -> None:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    _parallel_step({"up": ColwiseParallel(), "down": RowwiseParallel()}, False, rank, device)
    _no_eager_graphs()
    torch._dynamo.reset()
    _parallel_step({"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
                    "down": RowwiseParallel(output_layouts=Shard(1))}, True, rank, device)
    _no_eager_graphs()


def test_compiled_tensor_and_sequence_parallel():
    spawn(_tensor_parallel_worker)


# torchtitan's selective activation checkpointing: matmuls and the collectives' results saved (the
# reduce-scatter's still in flight when the forward graph returns it), the rest recomputed.
_SAVED = {torch.ops.aten.mm.default, torch.ops._c10d_functional.reduce_scatter_tensor.default,
          torch.ops._c10d_functional.all_reduce.default, torch.ops._c10d_functional.all_gather_into_tensor.default}


def _save_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy
    return CheckpointPolicy.MUST_SAVE if op in _SAVED else CheckpointPolicy.PREFER_RECOMPUTE


class _SelectivelyCheckpointed(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        from functools import partial

        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
        return checkpoint(self.inner, x, use_reentrant=False,
                          context_fn=partial(create_selective_checkpoint_contexts, _save_policy))


def _selective_checkpoint_worker(rank: int, device) -> None:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    _parallel_step({"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
                    "down": RowwiseParallel(output_layouts=Shard(1))}, True, rank, device,
                   wrap=_SelectivelyCheckpointed)
    _no_eager_graphs()


def test_compiled_sequence_parallel_with_selective_activation_checkpointing():
    # a collective's result saved for the backward leaves the forward graph as a tensor, never as
    # the placeholder of a transfer in flight (AOTAutograd: "tensors_saved_with_vc_check")
    spawn(_selective_checkpoint_worker)


def _simple_fsdp_train(kind: str, rank: int, device) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from torchneuron.distributed import simple_fsdp
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = simple_fsdp.data_parallel(MODELS[kind]().to(device), init_device_mesh("neuron", (world,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @torch.compile(backend="neuron")
    def step(x, y):
        opt.zero_grad()
        loss = loss_of(kind, model, x, y)
        loss.backward()
        opt.step()
        return loss

    for x, y in batches(kind, 3):
        step(x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device))
    full = simple_fsdp.full_state(model)
    names = [n for n, _ in MODELS[kind]().named_parameters()]
    reference = dict(zip(names, _full_batch_reference(kind, 3, 0.1), strict=True))
    assert full.keys() == reference.keys()
    _close([full[n].cpu() for n in reference], list(reference.values()))
    # the parameters stay sharded: each rank holds its half
    assert all(p.to_local().shape[0] <= (p.shape[0] + 1) // world for p in model.parameters())
    _no_eager_graphs()


def _simple_fsdp_worker(rank: int, device) -> None:
    for kind in ("mlp", "gpt"):
        _simple_fsdp_train(kind, rank, device)


def test_compiled_simple_fsdp_whole_step():
    spawn(_simple_fsdp_worker)


def _fsdp2_and_ddp_worker(rank: int, device) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP
    world, kind = dist.get_world_size(), "gpt"
    # FSDP2 around compiled blocks, the optimizer step compiled
    torch.manual_seed(0)
    model = MODELS[kind]().to(device)
    for layer in model.modules():
        if type(layer).__name__ == "Block":
            layer.compile(backend="neuron")
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_step = torch.compile(opt.step, backend="neuron")
    for x, y in batches(kind, 3):
        opt.zero_grad()
        loss_of(kind, model, x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)).backward()
        opt_step()
    expected = _full_batch_reference(kind, 3, 0.1)
    _close([p.full_tensor().detach().cpu() for p in model.parameters()], expected)
    _no_eager_graphs(segmented=False)
    graphs = compile_stats()["graphs"]
    assert graphs >= 3, compile_stats()  # a block's forward and backward, the optimizer step
    # DDP with a compiled model, small buckets: DDPOptimizer splits the graph at bucket boundaries
    # (the model is tiny: buckets of 16 KB, the first one too, split it into several)
    dist._DEFAULT_FIRST_BUCKET_BYTES = 16 * 1024
    torch.manual_seed(0)
    ddp = DDP(MODELS[kind]().to(device), bucket_cap_mb=16 / 1024)
    compiled = torch.compile(ddp, backend="neuron")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for x, y in batches(kind, 3):
        opt.zero_grad()
        loss_of(kind, compiled, x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)).backward()
        opt.step()
    _close([p.detach().cpu() for p in ddp.module.parameters()], expected)
    _no_eager_graphs(segmented=False)
    assert compile_stats()["graphs"] - graphs > 2, "DDPOptimizer did not split the graph"


def test_compiled_fsdp2_blocks_and_ddp():
    spawn(_fsdp2_and_ddp_worker)


def _dead_rank_in_compiled_step_worker(rank: int, device, deadline: float) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("neuron", (dist.get_world_size(),))
    block = torch.compile(parallelize_module(NormMLP().to(device), mesh, {"up": ColwiseParallel(),
                                                                          "down": RowwiseParallel()}),
                          backend="neuron")
    block(torch.randn(2, 6, 8, device=device)).sum().backward()  # compiled, collectives inside
    dist.barrier()
    if rank == 1:
        os._exit(3)
    time.sleep(1)
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        block(torch.randn(2, 6, 8, device=device)).sum().backward()
    assert time.monotonic() - start < deadline
    os._exit(0)  # (destroying the group would wait for the dead peer)


def test_dead_rank_inside_compiled_step_raises():
    # A dead peer is seen at once (connection closed), not at the group's timeout: the timeout only
    # has to outlast one rank compiling slower than the other on a loaded machine.
    context = spawn(_dead_rank_in_compiled_step_worker, 20.0, timeout=datetime.timedelta(seconds=60), join=False)
    first, *others = context.processes
    first.join(120)
    for p in others:
        p.kill()
        p.join()
    assert first.exitcode == 0, f"rank 0 did not raise in time (exit code {first.exitcode})"


def _mesh_2d_tensor_parallel_worker(rank: int, device) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    reference, block = NormMLP(), NormMLP()
    block.load_state_dict(reference.state_dict())
    # tensor parallel inside each data-parallel replica: collectives on sub-groups, two at a time
    block = torch.compile(parallelize_module(block.to(device), mesh["tp"], {"up": ColwiseParallel(),
                                                                            "down": RowwiseParallel()}),
                          backend="neuron")
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(mesh.get_local_rank("dp")))
    out = block(x.to(device))
    out.sum().backward()
    ref = reference(x)
    ref.sum().backward()
    grads = [_full(p.grad).cpu() for p in block.parameters()]
    _close([out.detach().cpu(), *grads], [ref.detach(), *[p.grad for p in reference.parameters()]])
    _no_eager_graphs()


def test_compiled_tensor_parallel_on_a_2x2_mesh():
    spawn(_mesh_2d_tensor_parallel_worker, world=4)


def _mismatch_in_compiled_step_worker(rank: int, device) -> None:
    # the ranks compile different graphs: their all-reduces disagree in size, and both raise
    def step(x):
        return funcol.all_reduce(x * 2, "sum", dist.group.WORLD).sum()

    with pytest.raises(RuntimeError, match="ranks disagree on allreduce"):
        torch.compile(step, backend="neuron")(torch.ones(4 + rank, device=device)).item()
    _no_eager_graphs()
    dist.barrier()  # the group still works


def test_mismatched_collectives_in_compiled_graphs_raise():
    spawn(_mismatch_in_compiled_step_worker, timeout=datetime.timedelta(seconds=60))


def test_collectives_inside_the_xla_program_opt_in():
    # TORCHNEURON_XLA_COLLECTIVES=1: JAX's multi-process runtime, graphs as one program per rank
    env = {"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "TORCHNEURON_XLA_COLLECTIVES": "1", "TORCHNEURON_CORES": "2",
           "TORCHNEURON_JAX_COORDINATOR": f"127.0.0.1:{free_port()}"}
    run = run_torchrun(os.path.join(ROOT, "tests", "distributed", "xla_collectives_job.py"), env=env)
    # (both ranks write to one pipe: their lines can interleave, "okok\n\n", so markers are counted as text)
    assert all(f"xla-collectives-rank-{rank}-ok" in run.stdout for rank in range(2)), run.stdout[-2000:]
