"""torchneuron: a native PyTorch device, "neuron", that runs ATen ops as XLA through JAX/PJRT.

    import torch, torchneuron
    x = torch.randn(4, 4).to("neuron")
    y = (x @ x.T).relu().sum()

Importing registers the device (PrivateUse1 renamed "neuron", the C++ core, the device
module `torch.neuron`, the eager kernels); with the package installed, `import torch` alone
does it through the `torch.backends` entry point.
"""
from __future__ import annotations

import torch

from . import config
from .runtime import devices  # configures JAX before anything else touches it

__all__ = ["ENVIRONMENT", "cache_stats", "capture", "eager_mode", "eager_stats", "fallback_stats", "jax_op",
           "set_cache_limit", "stats"]
ENVIRONMENT = config.ENVIRONMENT
_registered = False


def _register() -> None:
    """Wire the device into PyTorch once, in order: the device itself, the op kernels, then the
    libraries that build on them and the hooks into other libraries."""
    global _registered
    if _registered:
        return
    _registered = True
    _register_device()
    _register_kernels()
    _install_integrations()
    from .eager import modes

    modes.install()  # fused eager cuts its segments where optimizer steps end
    if not config.AUTOGRAD_THREADS:
        # Backward on the calling thread (the setting is per thread: this is the importing one).
        torch.autograd.set_multithreading_enabled(False)


def _register_device() -> None:
    """The PrivateUse1 backend named neuron: cores, memory limits, torch.neuron, module and tensor methods."""
    if torch._C._get_privateuse1_backend_name() != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    from .runtime import synchronize
    from .runtime.core import lib

    lib.tn_set_device_count(devices.count())
    for i in range(devices.count()):
        lib.tn_set_memory_limit(i, devices.default_memory_limit(i))
    synchronize.install()

    from . import device_module

    torch._register_device_module("neuron", device_module.build())
    from . import capture_guards, graphs

    capture_guards.install()  # no recorded step replays an optimizer's stale host numbers

    for name in graphs.DEVICE_API:  # torch.neuron.NeuronGraph, graph, make_graphed_callables
        setattr(torch.neuron, name, getattr(graphs, name))
        torch.neuron.API[name] = "stable"
    from . import module_moves

    module_moves.install()  # .to("neuron") keeps Parameter objects, as .cuda() does
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)


def _register_kernels() -> None:
    """The lowering table's kernels, sparse, autocast, profiler, c10d backend, compile backend."""
    from .eager import kernels
    from .lowering import load_all

    load_all()
    from . import amp, sparse  # (sparse: its refusals join the records before the kernels are registered)

    kernels.register_all()
    sparse.install()  # sparse COO tensors: the SparsePrivateUse1 kernels, refusals of other layouts
    amp.install()
    __import__("torchneuron.profiler").profiler.install()
    distributed = __import__("torchneuron.distributed").distributed
    distributed.register()
    distributed.start_on_local_rank()  # under torchrun: neuron:LOCAL_RANK is the current device
    from . import default_backend

    default_backend.install()  # torch.compile(model) of neuron tensors: the neuron backend
    from . import rng_replay

    rng_replay.install()  # activation checkpointing's RNG replay on neuron tensors, op by op


def _install_integrations() -> None:
    """Hooks into accelerate, transformers and PyTorch's own Python modules, each run once (if
    ever) the module it patches is imported."""
    from .integrations import huggingface

    huggingface.install()  # accelerate and transformers see neuron, once (if ever) they load
    from . import library_ops

    # transformers' MoE ops get lowerings once transformers defines them
    huggingface.when_imported("transformers.integrations.moe", library_ops.lower_transformers_moe)
    from .integrations import generate

    # generate decodes with a bucketed static cache, each step a replayed graph
    huggingface.when_imported("transformers.generation.utils", generate.on_generation_utils)
    huggingface.when_imported("transformers.modeling_utils", generate.on_modeling_utils)
    from .integrations import pipelines, trainer_rng

    # a pipeline with no device runs on neuron; Trainer checkpoints keep neuron's random state
    huggingface.when_imported("transformers.pipelines.base", pipelines.on_pipelines_base)
    huggingface.when_imported("transformers.trainer", trainer_rng.on_trainer)
    from .integrations import flex_attention

    # PyTorch's flex_attention lets neuron tensors past its device list
    huggingface.when_imported(flex_attention.MODULE, flex_attention.allow_neuron)
    from .integrations import nested

    # jagged nested tensors' attention runs padded through the fused SDPA lowering
    huggingface.when_imported(nested.MODULE, nested.route_sdpa)


_register()

from .counters import stats
from .custom_ops import jax_op
from .eager.fallback import fallback_stats
from .eager.modes import eager_mode, eager_stats
from .graphs import capture
from .runtime.executables import cache_stats, set_cache_limit
