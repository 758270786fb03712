"""Entry point of the `torch.backends` group: `import torch` alone registers neuron."""
import sys


def autoload() -> None:
    package = sys.modules.get("torchneuron")
    if package is not None and not hasattr(package, "_register"):
        return  # torchneuron itself is importing torch: it registers once torch is ready
    import torchneuron  # noqa: F401
