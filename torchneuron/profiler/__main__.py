"""python -m torchneuron.profiler: profile a few training steps of a tiny GPT, print the top ops."""
import torch

import torchneuron
from torchneuron.testing.models import GPT

model = GPT().to("neuron")
idx = torch.randint(0, 64, (4, 16), device="neuron")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    for _ in range(3):
        model(idx, idx).backward()
print(torchneuron.profiler.top_ops(prof, 20))
