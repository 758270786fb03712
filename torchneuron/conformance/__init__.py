"""OpInfo conformance: run PyTorch's OpInfo database on neuron and compare against CPU.

    python -m torchneuron.conformance --ops 'add' 'nn.functional.*' --dtypes float32 --jobs 2 --out DIR

Every OpInfo in torch.testing._internal.common_methods_invocations.op_db runs over its sample
inputs, for each dtype it supports on CPU: forward values, gradients, out= and in-place variants,
each compared with the same call on CPU. Each op x dtype is classified pass, mismatch, error,
used-fallback or skipped (see classify.py and skips.py). Ops run in spawned worker processes with a
timeout, so a crash or hang costs one op, not the run. Results: conformance.json, conformance.md and
conformance.png in the output folder.
"""
from .cli import main, run_conformance

__all__ = ["main", "run_conformance"]
