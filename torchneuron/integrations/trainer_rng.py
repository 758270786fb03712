"""transformers' Trainer keeps neuron's random state in its checkpoints, as it keeps CUDA's.

`Trainer._save_rng_state` writes `rng_state.pth` (`rng_state_<rank>.pth` with several processes)
with the generators of python, numpy, cpu and the accelerators it knows (cuda, xla, npu, hpu, mlu,
musa), and `_load_rng_state` restores them on resume. Without neuron's, a run resumed with dropout
drew other masks than the uninterrupted run. We add a "neuron" entry to the file the Trainer has just
written, every core's state when the run is distributed (CUDA's rule), and restore it after the
Trainer has restored the rest. accelerate's `save_state` saves torch.neuron's states by itself.
"""
from __future__ import annotations

import functools
import os

import torch

KEY = "neuron"


def _states_file(trainer, directory: str) -> str:
    name = "rng_state.pth" if trainer.args.world_size <= 1 else f"rng_state_{trainer.args.process_index}.pth"
    return os.path.join(directory, name)


def _distributed(trainer) -> bool:
    from transformers.training_args import ParallelMode
    return trainer.args.parallel_mode == ParallelMode.DISTRIBUTED


def _load(path: str) -> dict:
    from transformers.trainer_pt_utils import safe_globals
    with safe_globals():  # the numpy state inside, as the Trainer loads it
        return torch.load(path, weights_only=True)


def _saving_neuron(save):
    @functools.wraps(save)
    def _save_rng_state(self, output_dir: str) -> None:
        save(self, output_dir)
        if not torch.neuron.is_available():
            return
        path = _states_file(self, output_dir)
        states = _load(path)
        states[KEY] = torch.neuron.get_rng_state_all() if _distributed(self) else torch.neuron.get_rng_state()
        torch.save(states, path)

    _save_rng_state.torchneuron_wraps = save
    return _save_rng_state


def _loading_neuron(load):
    @functools.wraps(load)
    def _load_rng_state(self, checkpoint: str | None) -> None:
        load(self, checkpoint)
        if checkpoint is None or not torch.neuron.is_available():
            return
        path = _states_file(self, checkpoint)
        if not os.path.isfile(path):
            return  # the Trainer has said why
        state = _load(path).get(KEY)
        if state is None:
            return  # a checkpoint made without neuron
        if _distributed(self):
            torch.neuron.set_rng_state_all(state)
        else:
            torch.neuron.set_rng_state(state)

    _load_rng_state.torchneuron_wraps = load
    return _load_rng_state


def on_trainer(module) -> None:
    """Wrap the Trainer's RNG checkpointing once transformers.trainer has run."""
    trainer = module.Trainer
    if hasattr(trainer._save_rng_state, "torchneuron_wraps"):
        return
    trainer._save_rng_state = _saving_neuron(trainer._save_rng_state)
    trainer._load_rng_state = _loading_neuron(trainer._load_rng_state)
