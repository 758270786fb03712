import torch

import torchneuron  # noqa: F401  (registers the device before torch.testing is imported)

torch.manual_seed(0)
