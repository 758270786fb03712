"""all_reduce and all_gather bus bandwidth on neuron tensors vs gloo on CPU tensors, same run.

    torchrun --nproc-per-node=2 benchmarks/collectives.py [--max-mb 64]

Bus bandwidth follows nccl-tests: all_reduce moves size * 2(n-1)/n per rank, all_gather
(output size) * (n-1)/n. The neuron column includes the host staging and the signature check.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import torchneuron.distributed as tnd


def seconds(fn, iters: int, device) -> float:
    fn()  # warm up: compiles the device copies for this shape
    torch.neuron.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    if device.type == "neuron":
        torch.neuron.synchronize()
    return (time.perf_counter() - start) / iters


def measure(kind: str, nbytes: int, device, group) -> float:
    """Bus bandwidth in GB/s of one collective of `nbytes` per rank."""
    world = dist.get_world_size()
    x = torch.ones(nbytes // 4, device=device)
    if kind == "all_reduce":
        def fn():
            dist.all_reduce(x, group=group)
        moved = nbytes * 2 * (world - 1) / world
    else:
        out = torch.empty(world * x.numel(), device=device)

        def fn():
            dist.all_gather_into_tensor(out, x, group=group)
        moved = nbytes * world * (world - 1) / world
    iters = max(3, min(50, (64 << 20) // max(nbytes, 1) // 16))
    return moved / seconds(fn, iters, torch.device(device)) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-mb", type=int, default=64)
    args = parser.parse_args()
    device = tnd.init()
    gloo = dist.new_group(backend="gloo")
    sizes = [1 << k for k in range(10, 21 + (args.max_mb.bit_length() - 1), 2)]
    rows = []
    for kind in ("all_reduce", "all_gather"):
        for nbytes in sizes:
            rows.append((kind, nbytes, measure(kind, nbytes, device, None), measure(kind, nbytes, "cpu", gloo)))
    if dist.get_rank() == 0:
        print(f"{dist.get_world_size()} ranks; bus bandwidth GB/s")
        print(f"{'collective':<11} {'size':>8} {'neuron':>9} {'gloo cpu':>9} {'ratio':>6}")
        for kind, nbytes, neuron, cpu in rows:
            size = f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"
            print(f"{kind:<11} {size:>8} {neuron:9.4g} {cpu:9.4g} {neuron / cpu:6.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
