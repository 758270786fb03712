"""A 2-rank training step of the compile benchmark's GPT, sharded (FSDP) and tensor parallel (TP):
compiled vs eager on neuron, against gloo on CPU (eager and inductor), in the same run.

    torchrun --nproc-per-node=2 benchmarks/distributed_step.py [--steps 20] [--no-inductor]

FSDP: neuron eager is FSDP2 (`fully_shard` per block); compiled is SimpleFSDP
(`torchneuron.distributed.simple_fsdp`) with the whole step (forward, backward, SGD) compiled, its
all-gathers and reduce-scatters inside the graphs. TP: the blocks' MLPs column- then row-parallel;
compiled is the same model under torch.compile. Each case prints ms per step (rank 0; the median
of `--repeats` timings) and, for the compiled neuron cases, the share of the collectives' time
hidden behind compute (`in_flight.stats()`: 1 - time blocked in waits / time the transport worked).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

import torchneuron.distributed as tnd
from torchneuron.distributed import in_flight, simple_fsdp
from torchneuron.testing.models import GPT, batches, loss_of


def _sync(device) -> None:
    if device.type == "neuron":
        torch.neuron.synchronize()


def fsdp_case(device, mesh: DeviceMesh, compiled: str | None):
    torch.manual_seed(0)
    model = GPT().to(device)
    if compiled:
        model = simple_fsdp.data_parallel(model, mesh)
    else:
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return _step(model, device, compiled)


def tp_case(device, mesh: DeviceMesh, compiled: str | None):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    torch.manual_seed(0)
    model = GPT().to(device)
    for block in model.blocks:
        parallelize_module(block.mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    # (the single-tensor SGD: foreach kernels refuse a mix of DTensor and plain parameters, as on CUDA)
    return _step(model, device, compiled, whole=False, foreach=False)


def _step(model, device, compiled: str | None, whole: bool = True, foreach: bool | None = None):
    """A training step; compiled whole, or (`whole=False`) the model and the optimizer step each
    compiled (Dynamo cannot yet trace a whole step over tensor-parallel DTensors)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=foreach)
    opt_step = opt.step
    if compiled and not whole:
        model, opt_step = torch.compile(model, backend=compiled), torch.compile(opt.step, backend=compiled)

    def step(x, y):
        opt.zero_grad()
        loss = loss_of("gpt", model, x, y)
        loss.backward()
        opt_step()
        return loss

    step = torch.compile(step, backend=compiled) if compiled and whole else step
    rank, world = dist.get_rank(), dist.get_world_size()
    data = [(x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)) for x, y in batches("gpt", 4)]
    return lambda i: step(*data[i % len(data)])


def ms_per_step(run, device, steps: int, repeats: int) -> float:
    for i in range(3):  # compiles, then the optimizer state exists
        run(i)
    _sync(device)
    timings = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        for i in range(steps):
            run(i)
        _sync(device)
        timings.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-inductor", action="store_true")
    args = parser.parse_args()
    device = tnd.init()
    world = dist.get_world_size()
    neuron_mesh = init_device_mesh("neuron", (world,))
    cpu_mesh = DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu")
    cpu = torch.device("cpu")
    rows = []
    for name, case in (("FSDP", fsdp_case), ("TP", tp_case)):
        results = {}
        for label, dev, mesh, compiled in (("neuron eager", device, neuron_mesh, None),
                                           ("neuron compiled", device, neuron_mesh, "neuron"),
                                           ("cpu gloo eager", cpu, cpu_mesh, None),
                                           ("cpu gloo inductor", cpu, cpu_mesh, None if args.no_inductor else "inductor")):
            if label == "cpu gloo inductor" and args.no_inductor:
                continue
            torch._dynamo.reset()
            in_flight.reset_stats()
            try:
                results[label] = ms_per_step(case(dev, mesh, compiled), dev, args.steps, args.repeats)
            except Exception as e:  # noqa: BLE001 (inductor needs a C++ toolchain; report, go on)
                results[label] = float("nan")
                if dist.get_rank() == 0:
                    print(f"{name} {label}: {type(e).__name__}: {str(e)[:200]}")
            if label == "neuron compiled":
                s = in_flight.stats()
                hidden = 1 - s.get("waited_s", 0) / s["busy_s"] if s.get("busy_s") else float("nan")
                results["hidden"] = hidden
                results["collectives per step"] = s.get("issued", 0) / (3 + args.steps * args.repeats)
        rows.append((name, results))
    if dist.get_rank() == 0:
        print(f"GPT (width 32, 2 layers, batch 4 per rank), {world} ranks, ms per training step:")
        print("| step | neuron eager | neuron compiled | compiled / eager | cpu gloo eager | cpu gloo inductor "
              "| neuron compiled / cpu inductor | collectives hidden | collectives per step |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, r in rows:
            inductor = r.get("cpu gloo inductor", float("nan"))
            print(f"| {name} | {r['neuron eager']:.1f} | {r['neuron compiled']:.1f} | "
                  f"{r['neuron compiled'] / r['neuron eager']:.2f}x | {r['cpu gloo eager']:.1f} | {inductor:.1f} | "
                  f"{r['neuron compiled'] / inductor:.2f}x | {r['hidden']:.0%} | {r['collectives per step']:.0f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
