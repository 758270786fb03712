"""`torch.compile(model, backend="neuron")`: AOTAutograd graphs -> the lowering table -> one XLA
executable per graph."""
from . import optimizers
from .backend import neuron_backend
from .recompiles import compile_stats

optimizers.install()

__all__ = ["compile_stats", "neuron_backend"]
