"""Default generators of the NeuronCores and the (seed, offset) each random op consumes.

Like CUDA's Philox generator, a neuron generator's state is (seed, offset): a random op
derives its PRNG key from both and advances the offset, so manual_seed reproduces a run and
get_rng_state/set_rng_state save and restore it.
"""
from __future__ import annotations

import torch

_defaults: dict[int, torch.Generator] = {}


def default_generator(index: int) -> torch.Generator:
    gen = _defaults.get(index)
    if gen is None:
        gen = _defaults[index] = torch.Generator(device=torch.device("neuron", index))
        gen.manual_seed(torch.initial_seed())
    return gen


def next_seed_and_offset(device: torch.device, generator: torch.Generator | None) -> tuple[int, int]:
    gen = generator if generator is not None else default_generator(device.index or 0)
    offset = gen.get_offset()
    gen.set_offset(offset + 1)
    return gen.initial_seed() & 0x7FFFFFFFFFFFFFFF, offset
