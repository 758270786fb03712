"""The c10d backend "neuron": collectives against gloo on CPU, DDP, FSDP2, tensor and pipeline
parallelism, a 2-D mesh and faults. Each test spawns its ranks (never fork: JAX is initialised)."""
from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import torchneuron.distributed as tnd
from torchneuron.testing.models import MODELS, batches, loss_of
from torchneuron.testing.processes import free_port, run_torchrun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = datetime.timedelta(seconds=60)
# The 4-process mesh and the torchrun example add about a minute; run them with TORCHNEURON_SLOW_TESTS=1.
slow = pytest.mark.slow


def _entry(rank: int, worker, world: int, timeout: datetime.timedelta, args) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    device = tnd.init(timeout)
    try:
        worker(rank, device, *args)
    finally:
        dist.destroy_process_group()


def _env(world: int) -> dict:
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "TORCHNEURON_CORES": str(max(world, 2)),
                "OMP_NUM_THREADS": "1"}


def spawn(worker, *args, world: int = 2, timeout: datetime.timedelta = TIMEOUT, join: bool = True):
    """Run worker(rank, device, *args) on `world` spawned ranks in process group "neuron"."""
    saved = dict(os.environ)
    os.environ.update(_env(world))
    try:
        return mp.start_processes(_entry, args=(worker, world, timeout, args), nprocs=world, join=join,
                                  start_method="spawn")
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _close(actual, expected, dtype=None) -> None:
    exact = dtype is not None and not dtype.is_floating_point
    for a, e in zip(actual, expected, strict=True):
        assert a.device.type == "cpu" and e.device.type == "cpu"
        if exact:
            assert torch.equal(a, e), (a, e)
        else:
            torch.testing.assert_close(a, e, rtol=1e-2 if e.dtype == torch.bfloat16 else 1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- collectives
def _data(rank: int, shape, dtype, salt: int = 0) -> torch.Tensor:
    n = int(torch.Size(shape).numel())
    return ((torch.arange(n) * 3 + salt) % 5 + rank + 1).to(dtype).reshape(shape)


def _collectives(rank: int, world: int, device, group, dtype) -> list[torch.Tensor]:
    """Every collective once on tensors on `device`; the results as CPU tensors."""
    def t(shape, salt=0):
        return _data(rank, shape, dtype, salt).to(device)

    out = []
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT]
    for salt, op in enumerate(ops):
        x = t((3, 4), salt)
        dist.all_reduce(x, op=op, group=group)
        out.append(x)
    x = t((5,))
    dist.broadcast(x, src=1, group=group)
    out.append(x)
    gathered = [torch.empty(2, 3, dtype=dtype, device=device) for _ in range(world)]
    dist.all_gather(gathered, t((2, 3)), group=group)
    out += gathered
    into = torch.empty(2 * world, 3, dtype=dtype, device=device)
    dist.all_gather_into_tensor(into, t((2, 3)), group=group)
    out.append(into)
    rs = torch.empty(3, dtype=dtype, device=device)
    dist.reduce_scatter(rs, [t((3,), salt=i) for i in range(world)], group=group)
    out.append(rs)
    rst = torch.empty(2, 2, dtype=dtype, device=device)
    dist.reduce_scatter_tensor(rst, t((2 * world, 2)), group=group)
    out.append(rst)
    a2a = [torch.empty(2, dtype=dtype, device=device) for _ in range(world)]
    dist.all_to_all(a2a, [t((2,), salt=i) for i in range(world)], group=group)
    out += a2a
    in_splits = [1 + rank, 2]  # uneven: rank r sends 1 + r rows to rank 0, 2 rows to rank 1
    out_splits = [1 + j if rank == 0 else 2 for j in range(world)]
    single = torch.empty(sum(out_splits), 2, dtype=dtype, device=device)
    dist.all_to_all_single(single, t((sum(in_splits), 2)), out_splits, in_splits, group=group)
    out.append(single)
    coalesced = [t((2,)), t((3, 2), salt=1)]
    dist.all_reduce_coalesced(coalesced, group=group)
    out += coalesced
    x = t((4,))
    dist.all_reduce(x, group=group, async_op=True).wait()
    out.append(x)
    y = t((3,))
    if rank == 0:
        dist.send(y, 1, group=group)
    else:
        dist.recv(y, 0, group=group)
    out.append(y)
    dist.barrier(group=group)
    return [o.cpu() for o in out]


def _functional(rank: int, device) -> list[torch.Tensor]:
    import torch.distributed._functional_collectives as fc
    group = dist.group.WORLD
    x = _data(rank, (4, 2), torch.float32).to(device)
    results = [fc.all_reduce(x, "sum", group), fc.all_gather_tensor(x, 0, group),
               fc.reduce_scatter_tensor(x, "sum", 0, group),
               fc.all_to_all_single(x, [2, 2], [2, 2], group), fc.broadcast(x, 1, group)]
    ops = torch.ops._c10d_functional
    raw = ops.wait_tensor(ops.all_reduce(x, "avg", group.group_name))
    return [r.cpu() for r in results] + [raw.cpu()]


def _expected_functional(rank: int, world: int) -> list[torch.Tensor]:
    xs = [_data(r, (4, 2), torch.float32) for r in range(world)]
    total = sum(xs)
    return [total, torch.cat(xs), total.chunk(world)[rank],
            torch.cat([x.chunk(world)[rank] for x in xs]), xs[1], total / world]


def _collectives_worker(rank: int, device) -> None:
    world = dist.get_world_size()
    assert dist.get_backend() == "neuron"
    assert dist.Backend.default_device_backend_map["neuron"] == "neuron"
    assert dist.distributed_c10d.BackendConfig(dist.Backend.UNDEFINED).get_device_backend_map() == {
        "neuron": "neuron"}
    gloo = dist.new_group(backend="gloo")
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        _close(_collectives(rank, world, device, None, dtype), _collectives(rank, world, "cpu", gloo, dtype), dtype)
    for op in (dist.ReduceOp.AVG, dist.ReduceOp.PREMUL_SUM(0.5)):
        x = _data(rank, (3,), torch.float32)
        y = x.to(device)
        dist.all_reduce(y, op=op)
        factor = 1 / world if op == dist.ReduceOp.AVG else 0.5
        _close([y.cpu()], [sum(_data(r, (3,), torch.float32) for r in range(world)) * factor])
    _close(_functional(rank, device), _expected_functional(rank, world))
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(world)]


def test_collectives_match_gloo():
    spawn(_collectives_worker)


# --------------------------------------------------------------------------- data parallel
def _full_batch_reference(kind: str, steps: int, lr: float) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = MODELS[kind]()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in batches(kind, steps):
        opt.zero_grad()
        loss_of(kind, model, x, y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def _train_sharded(kind: str, model, rank: int, world: int, device, steps: int, lr: float) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in batches(kind, steps):
        x, y = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
        opt.zero_grad()
        loss_of(kind, model, x, y).backward()
        opt.step()


def _ddp_worker(rank: int, device, kind: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = DDP(MODELS[kind]().to(device))
    _train_sharded(kind, model, rank, dist.get_world_size(), device, 3, 0.1)
    _close([p.detach().cpu() for p in model.module.parameters()], _full_batch_reference(kind, 3, 0.1))


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_ddp_matches_full_batch(kind):
    spawn(_ddp_worker, kind)


def _fsdp_worker(rank: int, device, kind: str) -> None:
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = MODELS[kind]().to(device)
    for layer in model.modules():
        if (kind == "mlp" and isinstance(layer, torch.nn.Linear)) or type(layer).__name__ == "Block":
            fully_shard(layer)
    fully_shard(model)
    sharded = list(model.parameters())
    model.to(device).float()  # moving a sharded module keeps its DTensor Parameters (an optimizer's)
    assert all(a is b for a, b in zip(sharded, model.parameters()))
    _train_sharded(kind, model, rank, dist.get_world_size(), device, 3, 0.1)
    full = [p.full_tensor().detach().cpu() for p in model.parameters()]
    _close(full, _full_batch_reference(kind, 3, 0.1))


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_fsdp2_matches_full_batch(kind):
    spawn(_fsdp_worker, kind)


# ------------------------------------------------------------------- model parallel
class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def _tp_worker(rank: int, device) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("neuron", (dist.get_world_size(),))
    torch.manual_seed(0)
    reference = _Block()
    block = _Block()
    block.load_state_dict(reference.state_dict())
    block = parallelize_module(block.to(device), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    x = torch.randn(4, 8)
    out = block(x.to(device))
    out.sum().backward()
    ref_out = reference(x)
    ref_out.sum().backward()
    _close([out.cpu(), block.up.weight.grad.full_tensor().cpu(), block.down.weight.grad.full_tensor().cpu()],
           [ref_out.detach(), reference.up.weight.grad, reference.down.weight.grad])


def test_tensor_parallel_matches_unsharded():
    spawn(_tp_worker)


def _pipeline_worker(rank: int, device) -> None:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    torch.manual_seed(0)
    stages = [_Block(), _Block()]
    x, target = torch.randn(8, 8), torch.randn(8, 8)

    def loss_fn(out, tgt):
        return F.mse_loss(out, tgt)

    stage = PipelineStage(stages[rank].to(device), rank, 2, device)
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=loss_fn)
    losses = []
    if rank == 0:
        schedule.step(x.to(device))
    else:
        out = schedule.step(target=target.to(device), losses=losses)
    reference = torch.nn.Sequential(*[_Block() for _ in range(2)])
    for ref, s in zip(reference, stages):
        ref.load_state_dict({k: v.cpu() for k, v in s.state_dict().items()})
    ref_out = reference(x)
    ref_losses = [loss_fn(o, t) for o, t in zip(ref_out.chunk(2), target.chunk(2))]
    (sum(ref_losses) / 2).backward()  # the schedule scales gradients by 1 / n_microbatches
    grads = [p.grad.cpu() for p in stages[rank].parameters()]
    _close(grads, [p.grad for p in reference[rank].parameters()])
    if rank == 1:
        _close([out.detach().cpu(), torch.stack(losses).detach().cpu()], [ref_out.detach(), torch.stack(ref_losses)])


def test_pipeline_gpipe_matches():
    spawn(_pipeline_worker)


def _mesh_2d_worker(rank: int, device) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("dp", "tp"))
    full = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    sharded = distribute_tensor(full.to(device), mesh, [Shard(0), Shard(1)])
    assert sharded.to_local().shape == (2, 4)
    _close([(sharded * 2).sum().full_tensor().cpu(), sharded.full_tensor().cpu()], [(full * 2).sum(), full])


@slow
def test_2d_mesh_dtensor():
    spawn(_mesh_2d_worker, world=4)


# ---------------------------------------------------------------------------------- faults
def _dead_rank_worker(rank: int, device, deadline: float) -> None:
    if rank == 1:
        os._exit(3)
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        dist.all_reduce(torch.ones(4, device=device))
    assert time.monotonic() - start < deadline


def _stalled_rank_worker(rank: int, device, deadline: float) -> None:
    if rank == 1:
        time.sleep(deadline + 5)
        os._exit(0)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="(?i)timed out|timeout"):
        dist.all_reduce(torch.ones(4, device=device))
    assert time.monotonic() - start < deadline
    os._exit(0)


@pytest.mark.parametrize("worker", [_dead_rank_worker, _stalled_rank_worker], ids=["dead", "stalled"])
def test_failed_rank_raises_within_timeout(worker):
    timeout = datetime.timedelta(seconds=5)
    context = spawn(worker, 12.0, timeout=timeout, join=False)
    first, *others = context.processes
    first.join(60)
    for p in others:  # a stalled rank has nothing left to prove
        p.kill()
        p.join()
    assert first.exitcode == 0, f"rank 0 did not raise in time (exit code {first.exitcode})"


def _mismatch_worker(rank: int, device) -> None:
    with pytest.raises(RuntimeError, match="ranks disagree on allreduce: rank 0: allreduce torch.float32 x4; "
                                           "rank 1: allreduce torch.float32 x5"):
        dist.all_reduce(torch.ones(4 + rank, device=device))
    with pytest.raises(RuntimeError, match="rank 1: all_gather torch.int64"):
        x = torch.ones(2, device=device, dtype=torch.int64 if rank else torch.float32)
        dist.all_gather_into_tensor(torch.empty(4, device=device, dtype=x.dtype), x)
    dist.all_reduce(torch.ones(4, device=device))  # the group still works


def test_mismatched_shapes_raise():
    spawn(_mismatch_worker, timeout=datetime.timedelta(seconds=10))


# ------------------------------------------------------------------------------- torchrun
@slow
def test_torchrun_fsdp2_example():
    run = run_torchrun(os.path.join(ROOT, "examples", "fsdp2_train.py"), "--steps", "3",
                       env={"PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}, timeout=240)
    assert "step 2" in run.stdout
