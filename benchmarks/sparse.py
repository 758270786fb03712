"""Sparse COO on neuron against PyTorch CPU's sparse kernels and against the dense product.

Two cases, timed in interleaved rounds (timing.py), each printed as ms per call and as a ratio to
PyTorch CPU's sparse kernel measured in the same run:
- `torch.sparse.mm` of a 1%-dense 4096x4096 COO matrix by a 4096x256 dense one (neuron sparse,
  CPU sparse, and the same product dense on neuron and on CPU);
- a sparse-embedding training step: EmbeddingBag(sparse=True) over a 100,000-row table, a linear
  head, SparseAdam on the table and Adam on the head (neuron and CPU).

    python benchmarks/sparse.py [--rounds 5] [--size 4096] [--density 0.01]
"""
from __future__ import annotations

import argparse

import torch
from timing import interleaved_seconds_per_call, sync_for

import torchneuron  # noqa: F401  (registers the device)


def _kept(fn, device: str):
    """(fn keeping each result alive until the sync, the sync): a fused-eager result nobody holds is
    never computed, so a dropped result would time nothing."""
    held, sync = [], sync_for(device)

    def call():
        held.append(fn())

    def synced():
        sync()
        held.clear()

    return call, synced


def _sparse_matrix(size: int, density: float, generator: torch.Generator) -> torch.Tensor:
    nnz = int(size * size * density)
    indices = torch.randint(0, size, (2, nnz), generator=generator)
    values = torch.randn(nnz, generator=generator)
    return torch.sparse_coo_tensor(indices, values, (size, size), check_invariants=True).coalesce()


def spmm_cases(size: int, density: float, width: int) -> dict:
    g = torch.Generator().manual_seed(0)
    a = _sparse_matrix(size, density, g)
    b = torch.randn(size, width, generator=g)
    cases = {}
    for device in ("cpu", "neuron"):
        sa, sb = a.to(device), b.to(device)
        dense = sa.to_dense()
        cases[f"sparse.mm {device}"] = _kept(lambda sa=sa, sb=sb: torch.sparse.mm(sa, sb), device)
        cases[f"dense mm {device}"] = _kept(lambda dense=dense, sb=sb: dense @ sb, device)
    return cases


class BagClassifier(torch.nn.Module):
    def __init__(self, rows: int, dim: int, classes: int):
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(rows, dim, mode="mean", sparse=True)
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, ids, offsets):
        return self.head(self.bag(ids, offsets))


def embedding_step_cases(rows: int = 100_000, dim: int = 64, batch: int = 256, bag: int = 20) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, rows, (batch * bag,), generator=g)
    offsets = torch.arange(0, batch * bag, bag)
    labels = torch.randint(0, 10, (batch,), generator=g)
    cases = {}
    for device in ("cpu", "neuron"):
        torch.manual_seed(0)
        model = BagClassifier(rows, dim, 10).to(device)
        sparse_opt = torch.optim.SparseAdam(list(model.bag.parameters()), lr=1e-2)
        dense_opt = torch.optim.Adam(model.head.parameters(), lr=1e-2)
        x, o, y = ids.to(device), offsets.to(device), labels.to(device)

        def step(model=model, sparse_opt=sparse_opt, dense_opt=dense_opt, x=x, o=o, y=y):
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x, o), y).backward()
            sparse_opt.step()
            dense_opt.step()

        cases[f"embedding step {device}"] = (step, sync_for(device))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    for title, cases, baseline in (
            (f"torch.sparse.mm: {args.size}x{args.size} COO at {args.density:.0%} @ {args.size}x{args.width}",
             spmm_cases(args.size, args.density, args.width), "sparse.mm cpu"),
            ("sparse-embedding training step (EmbeddingBag sparse=True, SparseAdam)", embedding_step_cases(),
             "embedding step cpu")):
        seconds = interleaved_seconds_per_call(cases, repeat=3, rounds=args.rounds, warmup=2)
        print(title)
        for name, s in seconds.items():
            print(f"  {name:<22} {s * 1e3:9.2f} ms   {s / seconds[baseline]:6.2f}x {baseline}")


if __name__ == "__main__":
    main()
