"""`torch.compile(model, backend="neuron")`: AOTAutograd graphs -> the lowering table -> one XLA
executable per graph."""
from .backend import compile_stats, neuron_backend

__all__ = ["compile_stats", "neuron_backend"]
